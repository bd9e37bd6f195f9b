#!/usr/bin/env bash
# flash.sh: --batched-attention flash (mlxd/model/decode_kernel.py) on the H200: its tests on
# MLX-CUDA (carry .whlT), its error and time against folded attention (probe_flash, 0.6B and 8B
# shapes), then the 0.6B 32-row step whole (probe_ops, folded+fused against flash+fused).
set -uo pipefail
source bench/h200/setup.sh || exit 1
TESTS_TIMEOUT=240 bash bench/h200/cuda_tests.sh tests/model/test_decode_kernel.py
python3 -m mlxd.bench.probe_flash --shape qwen3-0.6b --rows 8 32 --contexts 512 4096 \
  | tee "$OUT/flash-0.6b.txt"
python3 -m mlxd.bench.probe_flash --shape qwen3-8b --rows 8 32 --contexts 4096 \
  | tee "$OUT/flash-8b.txt"
for g in 0 1; do
  MLX_USE_CUDA_GRAPHS=$g python3 -m mlxd.bench.probe_ops --shape qwen3-0.6b --rows 32 \
    --context 4096 --modes folded+fused flash+fused | tee -a "$OUT/flash-ops.txt"
done
