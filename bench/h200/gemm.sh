#!/usr/bin/env bash
# gemm.sh: the +gemm modes of --batched-attention (mlxd/model/row_matmul.py) on the H200: their
# tests and the flash kernels' on MLX-CUDA (carry .whlT), probe_matmul's few-row sweep with
# gather_mm beside cuBLASLt (host and total time), then probe_ops folded+fused against
# folded+fused+gemm at 32 and 8 rows x 4k keys, graphs off and on, at the 0.6B and 8B shapes.
set -uo pipefail
source bench/h200/setup.sh || exit 1
TESTS_TIMEOUT=150 bash bench/h200/cuda_tests.sh tests/model/test_row_matmul.py \
  tests/model/test_decode_kernel.py | tail -4
for s in qwen3-0.6b qwen3-8b; do
  python3 -m mlxd.bench.probe_matmul --shape $s --rows 1 8 32 --no-steps | tee "$OUT/matmul-$s.txt"
done
for s in qwen3-0.6b qwen3-8b; do
  for g in 0 1; do
    MLX_USE_CUDA_GRAPHS=$g python3 -m mlxd.bench.probe_ops --shape $s --rows 32 8 --context 4096 \
      --modes folded+fused folded+fused+gemm | cut -c1-120 | sed "s/^/graphs=$g /" \
      | tee -a "$OUT/gemm-ops.txt"
  done
done
