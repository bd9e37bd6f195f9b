#!/usr/bin/env bash
# kernels.sh: probe_kernels (each kernel's GPU time in a decode step, via torch.profiler's
# CUPTI tracing) over the fleet's shapes: 0.6B and 8B at 32 rows x 4k keys with graphs off and
# on, 0.6B at 8 rows (+gemv), and one row of mlx-lm's step, plain and with q/k/v and gate/up
# stacked (--decode-step rows+fused). KERNEL_SETS overrides the list ("SHAPE ROWS MODE GRAPHS
# [fused]" per line). Output: $OUT/kernels.txt.
set -uo pipefail
source bench/h200/setup.sh || exit 1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
  2>&1 | tee -a "$OUT/kernels.txt"
sets=${KERNEL_SETS:-"qwen3-0.6b 32 folded+fused 0
qwen3-0.6b 32 folded+fused 1
qwen3-0.6b 8 folded+fused+gemv 1
qwen3-0.6b 1 mlx 1
qwen3-0.6b 1 mlx 1 fused
qwen3-8b 32 folded+fused 0
qwen3-8b 32 folded+fused 1
qwen3-8b 1 mlx 1
qwen3-8b 1 mlx 1 fused"}
while read -r shape rows mode graphs fused; do
  MLX_USE_CUDA_GRAPHS=$graphs timeout "${KERNEL_TIMEOUT:-150}" python3 -m bench.probes.probe_kernels \
    --shape "$shape" --rows "$rows" --modes "$mode" --sequence "${SEQUENCE:-36}" \
    ${fused:+--fuse} 2>&1 \
    | grep -v Warning | tee -a "$OUT/kernels.txt"
done <<< "$sets"
