#!/usr/bin/env bash
# newrows.sh [SHAPE] ["ROWS ..."] ["KEYS ..."]: per row count and cache length, twice in one
# process (probe_new_rows): its caches' build, its first batched step against the same step
# warm, and every layer's leave to it; CUDA graphs off as the 0.6B fleet runs (GRAPHS=1: on);
# MLX-CUDA's PTX cache file count before and after (/tmp/mlx/<version>/ptx: a count that grows
# with the shapes means JIT compiles). Run on a fresh start.
set -euo pipefail
source bench/h200/setup.sh
shape=${1:-qwen3-0.6b} rows=${2:-32 27 28 29 5 3} keys=${3:-3700 4027}
echo "ptx files before: $(ls /tmp/mlx/*/ptx 2>/dev/null | wc -l)" | tee "$OUT/newrows-$shape.txt"
MLX_USE_CUDA_GRAPHS=${GRAPHS:-0} python3 -m bench.probes.probe_new_rows --shape "$shape" \
  --rows $rows --context $keys 2>&1 | tee -a "$OUT/newrows-$shape.txt"
echo "ptx files after: $(ls /tmp/mlx/*/ptx 2>/dev/null | wc -l)" | tee -a "$OUT/newrows-$shape.txt"
