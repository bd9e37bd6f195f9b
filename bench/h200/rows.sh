#!/usr/bin/env bash
# rows.sh: the folded modes' step over 2-D rows (model/rows_step.py: no Flatten/Unflatten around
# the projections, weight transposes held, heads reshaped straight) on the device: its CUDA
# tests (the rows step against the 3-D step, bit for bit), each step's ops and views, then
# probe_ops' 3-D step against the rows step alternated block by block: 0.6B at ROWS x 4k keys,
# the gemv mode at 8 rows, and 8B at 8 rows.
set -uo pipefail
source bench/h200/setup.sh || exit 1
bash bench/h200/cuda_tests.sh tests/model/test_rows_step.py tests/model/test_folded_attention.py | tail -6
probe() { python3 -m bench.probes.probe_ops --context 4096 "$@" | tee -a "$OUT/rows.txt"; }
probe --shape qwen3-0.6b --rows 32 --steps 10 --modes folded+fused/3d folded+fused | cut -c1-200
probe --shape qwen3-0.6b --rows ${ROWS:-8 32} --steps 4 --alternate 20 --modes folded+fused/3d folded+fused
probe --shape qwen3-0.6b --rows 8 --steps 4 --alternate 20 --modes folded+fused+gemv/3d folded+fused+gemv
probe --shape qwen3-8b --rows 8 --steps 4 --alternate ${BIG_BLOCKS:-12} --modes folded+fused/3d folded+fused
true
