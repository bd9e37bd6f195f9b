#!/usr/bin/env bash
# A step probe with CUDA graphs on and off. PROBE: probe_graphs (default) or probe_compile
# (e.g. PROBE=probe_compile PROBE_ROWS="1 8 32" PROBE_SHAPES="qwen3-0.6b qwen3-8b").
# PROBE_SHAPES (8B and 0.6B), PROBE_ROWS (8 32), PROBE_CONTEXT (4096, the fleet's), and for
# probe_graphs PROBE_STEP (argmax, or engine: BatchGenerator's step); PROBE_GRAPHS ("1 0"),
# PROBE_ARGS (more flags for the probe, e.g. --growing-only).
set -uo pipefail
source bench/h200/setup.sh
probe=${PROBE:-probe_graphs}
read -r -a extra <<< "${PROBE_ARGS:-}"
[ "$probe" = probe_graphs ] && extra+=(--step "${PROBE_STEP:-argmax}")
for shape in ${PROBE_SHAPES:-qwen3-8b qwen3-0.6b}; do
  for graphs in ${PROBE_GRAPHS:-1 0}; do
    echo "=== $shape MLX_USE_CUDA_GRAPHS=$graphs"
    MLX_USE_CUDA_GRAPHS=$graphs timeout "${PROBE_TIMEOUT:-200}" python3 -m "bench.probes.$probe" \
      --shape "$shape" --rows ${PROBE_ROWS:-8 32} --context "${PROBE_CONTEXT:-4096}" --steps 64 \
      "${extra[@]}" 2>&1 | tail -12
  done
done | tee "$OUT/${probe//_/-}.txt"
