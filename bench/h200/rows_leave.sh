#!/usr/bin/env bash
# rows_leave.sh SHAPE AGENTS "MLXD_ARGS": rows ending at different steps (--min-tokens MIN,
# default 128, of 256): mlxd with rows leaving by slices against the gather (MLXD_TAKE_ROWS,
# kv/take_rows.py), ROUNDS (default 2) alternations of one round each, mlxd alone with
# MLXD_TRACE; then BOTH=1 runs mlxd and mlx_lm.server on that workload (FLEET_ROUNDS, 2).
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=$3
model=$(model_dir "$shape")
work=(--agents "$agents" --turns 2 --warmup 8 --max-tokens 256 --min-tokens "${MIN:-128}"
  --system-tokens 3600 --batch "${BATCH:-32}" --mlxd-args "$extra")
env_ab MLXD_TAKE_ROWS "slices gather" rows-leave.txt "$model" "${work[@]}"
if [ -n "${BOTH:-}" ]; then
  python3 -m mlxd bench serve --model "$model" "${work[@]}" --rounds "${FLEET_ROUNDS:-2}" \
    --json "$OUT/fleet-mixed.json" 2>&1 | tee "$OUT/fleet-mixed.txt" | grep -E "^\| [0-9]|round|ratio"
fi
[ "${ROUNDS:-2}" = 0 ] || { cd "$OUT" && tar czf rows-leave-traces.tar.gz trace-*.jsonl env-*.json && rm -f trace-*.jsonl env-*.json; }
