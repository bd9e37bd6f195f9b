#!/usr/bin/env bash
# buffers.sh: MLX-CUDA's command-buffer knobs against the decode step (probe_compile
# --growing-only: mlx-lm's step at 1 row, folded at 8 and 32), 0.6B and 8B over 4k contexts,
# each setting in its own process (MLX reads them once), PASSES times (default 1).
set -uo pipefail
source bench/h200/setup.sh
settings=("MLX_USE_CUDA_GRAPHS=1"
  "MLX_USE_CUDA_GRAPHS=1 MLX_MAX_OPS_PER_BUFFER=100 MLX_MAX_MB_PER_BUFFER=1000"
  "MLX_USE_CUDA_GRAPHS=1 MLX_MAX_OPS_PER_BUFFER=400 MLX_MAX_MB_PER_BUFFER=4000"
  "MLX_USE_CUDA_GRAPHS=0")
for pass in $(seq "${PASSES:-1}"); do
  for shape in ${PROBE_SHAPES:-qwen3-0.6b qwen3-8b}; do
    for s in "${settings[@]}"; do
      echo "=== pass $pass $shape $s"
      env $s timeout 120 python3 -m bench.probes.probe_compile --shape "$shape" --rows 1 8 32 \
        --context 4096 --steps 64 --growing-only 2>&1 | tail -3
    done
  done
done | tee "$OUT/buffers.txt"
