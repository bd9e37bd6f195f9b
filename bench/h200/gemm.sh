#!/usr/bin/env bash
# gemm.sh: the +gemm modes of --batched-attention (mlxd/model/row_matmul.py) on the H200: their
# tests and the flash kernels' on MLX-CUDA (carry .whlT), probe_matmul's few-row sweep with
# gather_mm beside cuBLASLt (host and total time; the stacked projections and the head too),
# then probe_ops at 32 rows x 4k keys, graphs off: folded+fused against +gemm with all parts,
# without the head, and the head alone (MLXD_GEMM_PARTS), at the 0.6B and 8B shapes.
set -uo pipefail
source bench/h200/setup.sh || exit 1
TESTS_TIMEOUT=100 bash bench/h200/cuda_tests.sh tests/model/test_row_matmul.py | tail -3
TESTS_TIMEOUT=100 bash bench/h200/cuda_tests.sh tests/model/test_decode_kernel.py | tail -3
for s in qwen3-0.6b qwen3-8b; do
  python3 -m mlxd.bench.probe_matmul --shape $s --rows 8 32 --no-steps | tee "$OUT/matmul-$s.txt"
done
for s in qwen3-0.6b qwen3-8b; do
  for p in qkv,o,gate_up,down,head qkv,o,gate_up,down head; do
    MLXD_GEMM_PARTS=$p MLX_USE_CUDA_GRAPHS=0 python3 -m mlxd.bench.probe_ops --shape $s --rows 32 \
      --context 4096 --modes folded+fused folded+fused+gemm | cut -c1-120 | sed "s/^/$p /" \
      | tee -a "$OUT/gemm-ops.txt"
  done
done
