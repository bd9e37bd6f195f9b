#!/usr/bin/env bash
# probe_graphs on 8B and 0.6B, 8 and 32 rows at the fleet's ~4k context, CUDA graphs on and off.
set -uo pipefail
source bench/h200/setup.sh
for shape in qwen3-8b qwen3-0.6b; do
  for graphs in 1 0; do
    echo "=== $shape MLX_USE_CUDA_GRAPHS=$graphs"
    MLX_USE_CUDA_GRAPHS=$graphs timeout "${PROBE_TIMEOUT:-150}" python3 -m mlxd.bench.probe_graphs \
      --shape "$shape" --rows 8 32 --context "${PROBE_CONTEXT:-4096}" --steps 64 2>&1 | tail -12
  done
done | tee "$OUT/probe-graphs.txt"
