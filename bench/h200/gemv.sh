#!/usr/bin/env bash
# gemv.sh: the +gemv mode (model/row_gemv.py: few-row projections as MLX's batched gemv, not
# cuBLASLt) on the device: its CUDA tests, then probe_ops' folded+fused against
# folded+fused+gemv, alternated block by block (a single run moves with the machine's minute):
# 0.6B at ROWS x 4k keys, then the attention scores as gemvs too (MLXD_GEMV_PARTS's qk) against
# the default parts at 2 and 8 rows, and BIG=1 the 8B shape with o_proj let in, then every weight.
set -uo pipefail
source bench/h200/setup.sh || exit 1
bash bench/h200/cuda_tests.sh tests/model/test_row_gemv.py | tail -6
probe() { python3 -m bench.probes.probe_ops --context 4096 --steps 4 --alternate 30 "$@" | tee -a "$OUT/gemv.txt"; }
export MLXD_GEMV_ROWS=32
probe --shape qwen3-0.6b --rows ${ROWS:-2 8 16 32} --modes folded+fused folded+fused+gemv
unset MLXD_GEMV_ROWS
probe --shape qwen3-0.6b --rows 2 8 --modes folded+fused+gemv "folded+fused+gemv@qkv,o,gate_up,down,qk"
# 8B: 40 MB lets in o_proj (32 MB, within the H200's 50 MB L2), 256 MB every projection.
for mb in ${BIG:+40 256}; do
  echo "MLXD_GEMV_MAX_MB=$mb" | tee -a "$OUT/gemv.txt"
  MLXD_GEMV_MAX_MB=$mb probe --shape qwen3-8b --rows 2 8 --modes folded+fused folded+fused+gemv
done
true
