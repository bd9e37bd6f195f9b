#!/usr/bin/env bash
# matmul.sh: probe_matmul's few-row sweep (cuBLASLt against one gemv per row) on 0.6B and 8B,
# then probe_compile at 8 and 32 rows on 0.6B (PROBE_ROWS, PROBE_SHAPES), graphs at their default.
set -uo pipefail
source bench/h200/setup.sh
for shape in qwen3-0.6b qwen3-8b; do
  echo "=== $shape"
  timeout 150 python3 -m bench.probes.probe_matmul --shape "$shape" --rows 1 2 8 16 32 --no-steps 2>&1 | tail -30
done | tee "$OUT/probe-matmul.txt"
for shape in ${PROBE_SHAPES:-qwen3-0.6b}; do
  echo "=== $shape"
  timeout 200 python3 -m bench.probes.probe_compile --shape "$shape" --rows ${PROBE_ROWS:-8 32} \
    --context 4096 --steps 64 2>&1 | tail -4
done | tee "$OUT/probe-compile.txt"
