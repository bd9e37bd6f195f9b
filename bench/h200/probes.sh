#!/usr/bin/env bash
# probe_graphs with CUDA graphs on and off: PROBE_SHAPES (8B and 0.6B), PROBE_ROWS (8 32),
# PROBE_CONTEXT (4096, the fleet's), PROBE_STEP (argmax, or engine: BatchGenerator's step).
set -uo pipefail
source bench/h200/setup.sh
for shape in ${PROBE_SHAPES:-qwen3-8b qwen3-0.6b}; do
  for graphs in 1 0; do
    echo "=== $shape MLX_USE_CUDA_GRAPHS=$graphs"
    MLX_USE_CUDA_GRAPHS=$graphs timeout "${PROBE_TIMEOUT:-150}" python3 -m mlxd.bench.probe_graphs \
      --shape "$shape" --rows ${PROBE_ROWS:-8 32} --context "${PROBE_CONTEXT:-4096}" --steps 64 \
      --step "${PROBE_STEP:-argmax}" 2>&1 | tail -12
  done
done | tee "$OUT/probe-graphs.txt"
