#!/usr/bin/env bash
# mask.sh [SHAPES]: the folded mask's `where` laid out whole (MLXD_MASK_LAYOUT=contiguous, a
# select: the same bits) against its broadcast condition, at 32 rows x 4k keys, graphs off:
# probe_kernels' select kernel and GPU busy for both, then probe_ops alternated block by block
# (default shapes: qwen3-0.6b qwen3-8b). Output: $OUT/mask.txt.
set -uo pipefail
source bench/h200/setup.sh || exit 1
for shape in ${1:-qwen3-0.6b qwen3-8b}; do
  MLX_USE_CUDA_GRAPHS=0 timeout 150 python3 -m bench.probes.probe_kernels --shape "$shape" \
    --rows 32 --modes folded+fused folded+fused/contiguous-mask --top 8 2>&1 | grep -v Warning \
    | tee -a "$OUT/mask.txt"
  MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 -m bench.probes.probe_ops --shape "$shape" --rows 32 \
    --modes folded+fused folded+fused/contiguous-mask --steps 10 --alternate "${BLOCKS:-20}" 2>&1 \
    | grep -v Warning | tee -a "$OUT/mask.txt"
done
