#!/usr/bin/env bash
# expect_ab.sh SHAPE AGENTS "MLXD_ARGS": the join window's turns expected back (replies that
# ended hold a new wave for their next turns, engine/arrivals.py) on (MLXD_JOIN_EXPECT=1)
# against off (0), mlxd alone, ROUNDS (default 3) alternations of one round each with
# MLXD_TRACE: tok/s, TTFT and the rounds' join lines (how many waves each turn took) in
# expect-ab.txt. MIN=128 draws replies of 128-256 tokens (rows end apart, agents come back apart);
# WARM=0 skips the untimed first run.
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=$3
model=$(model_dir "$shape")
work=(--agents "$agents" --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600
  --batch "${BATCH:-32}" --mlxd-args "$extra" ${MIN:+--min-tokens $MIN})
if [ "${WARM:-1}" != 0 ]; then  # a fresh machine's first compiles land in an untimed run
  python3 -m mlxd bench serve --model "$model" "${work[@]}" --only mlxd >/dev/null 2>&1 || true
fi
echo "replies ${MIN:-256}-256 tokens" >"$OUT/expect-ab.txt"
ROUNDS=${ROUNDS:-3} env_ab MLXD_JOIN_EXPECT "1 0" expect-ab.txt "$model" "${work[@]}"
cd "$OUT" && tar czf expect-ab-traces.tar.gz trace-*.jsonl env-*.json && rm -f trace-*.jsonl env-*.json
