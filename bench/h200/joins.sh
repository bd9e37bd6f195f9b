#!/usr/bin/env bash
# joins.sh SHAPE AGENTS "MLXD_ARGS": where a fleet's joins go. mlxd alone, ROUNDS (default 3)
# rounds in one server with MLXD_TRACE; trace_report's join lines with their parts (merge,
# forward, roll, first step, snapshots, padded shape: engine/instrument.py), then probe_join at
# the fleet's turn-1 shape with the plain model and the mode's (PROBE_NEW, default 55).
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=$3
model=$(model_dir "$shape")
MLXD_TRACE="$OUT/trace-joins.jsonl" python3 -m mlxd bench serve --model "$model" \
  --agents "$agents" --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600 \
  --rounds "${ROUNDS:-3}" --batch "${BATCH:-32}" --mlxd-args "$extra" --only mlxd \
  --json "$OUT/joins.json" 2>&1 | grep -E "^\| [0-9]|round" | tee "$OUT/joins.txt"
python3 -m bench.probes.trace_report "$OUT/trace-joins.jsonl" --stall 0.03 \
  | grep -E -A1 "prompt [1-9]|rows:" | grep -v "^--" | tee -a "$OUT/joins.txt"
attention=$(echo "$extra" | grep -oE "folded[a-z+]*" || echo mlx)
for mode in mlx "$attention"; do
  echo "== probe_join $mode" | tee -a "$OUT/joins.txt"
  python3 -m bench.probes.probe_join --shape "$shape" --rows "$agents" --cached 3609 \
    --new "${PROBE_NEW:-55}" --attention "$mode" 2>&1 | grep repeat | tee -a "$OUT/joins.txt"
done
gzip "$OUT/trace-joins.jsonl" "$OUT/joins.json"
