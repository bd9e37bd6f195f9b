#!/usr/bin/env bash
# rows.sh: the +rows mode (model/rows_kernel.py: few-row projections through a kernel MLX
# launches itself, not cuBLASLt) on the device: its CUDA tests, then probe_ops' folded+fused
# against folded+fused+rows at 2, 8 and 32 rows x 4k keys, graphs on, for each of SHAPES.
set -uo pipefail
source bench/h200/setup.sh || exit 1
bash bench/h200/cuda_tests.sh tests/model/test_rows_kernel.py | tail -12
for shape in ${SHAPES:-qwen3-0.6b qwen3-8b}; do
  python3 -m mlxd.bench.probe_ops --shape "$shape" --rows ${ROWS:-2 8 32} --context 4096 \
    --modes folded+fused folded+fused+rows | cut -c1-118 | tee -a "$OUT/rows.txt"
done
