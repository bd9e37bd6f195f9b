#!/usr/bin/env bash
# split_sweep.sh SHAPE ROWS: probe_kernels' thread order at each MLXD_STEP_SPLIT in SPLITS
# (default "0.33 0.5 0.67 1"), graphs off, REPEAT (default 2) times in turn: how much of step
# n+1 the encoder may queue before reading step n, against the GPU's idle time a step and the
# whole-layer KV copies (the donation race) it brings. Output: $OUT/split-sweep.txt.
set -uo pipefail
source bench/h200/setup.sh || exit 1
shape=$1 rows=$2
for rep in $(seq 1 "${REPEAT:-2}"); do
  for split in ${SPLITS:-0.33 0.5 0.67 1}; do
    echo "== split $split, repeat $rep" | tee -a "$OUT/split-sweep.txt"
    MLXD_STEP_SPLIT=$split MLX_USE_CUDA_GRAPHS=0 timeout "${SWEEP_TIMEOUT:-120}" \
      python3 -m bench.probes.probe_kernels --shape "$shape" --rows "$rows" \
      --modes "${MODE:-folded+fused}" --orders thread --steps "${STEPS:-20}" --top 8 2>&1 \
      | grep -v Warning | tee -a "$OUT/split-sweep.txt"
  done
done
