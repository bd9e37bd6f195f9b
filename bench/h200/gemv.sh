#!/usr/bin/env bash
# gemv.sh: the +gemv mode (model/row_gemv.py: few-row projections as MLX's batched gemv, not
# cuBLASLt) on the device: its CUDA tests, then probe_ops' folded+fused against
# folded+fused+gemv at ROWS x 4k keys, graphs on: 0.6B every row count through the gemv, the
# head too, and 8B with its weights let in (MLXD_GEMV_MAX_MB=256).
set -uo pipefail
source bench/h200/setup.sh || exit 1
bash bench/h200/cuda_tests.sh tests/model/test_row_gemv.py | tail -6
probe() { python3 -m mlxd.bench.probe_ops --context 4096 "$@" | cut -c1-118 | tee -a "$OUT/gemv.txt"; }
export MLXD_GEMV_ROWS=32
probe --shape qwen3-0.6b --rows ${ROWS:-2 8 16 32} --modes folded+fused folded+fused+gemv
MLXD_GEMV_PARTS=qkv,o,gate_up,down,head probe --shape qwen3-0.6b --rows 2 8 --modes folded+fused+gemv
[ -n "${BIG:-}" ] && MLXD_GEMV_MAX_MB=256 probe --shape qwen3-8b --rows 2 8 --modes folded+fused folded+fused+gemv
true
