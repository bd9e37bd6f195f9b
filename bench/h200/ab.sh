#!/usr/bin/env bash
# ab.sh SHAPE AGENTS "MLXD_ARGS_A" "MLXD_ARGS_B" ...: mlxd alone (--only mlxd), one fleet per
# argument set, ROUNDS times in alternation (A B A B ...), each with MLXD_TRACE (a line per
# engine turn) in $OUT/trace-<TAG><set>-<round>.jsonl and trace_report's decode-step lines
# after its bench line, with the turns where rows joined: engine settings compared in one call.
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2
shift 2
model=$(model_dir "$shape")
tag=${TAG:-}
for round in $(seq 1 "${ROUNDS:-1}"); do
  i=0
  for extra in "$@"; do
    run="$tag$i-$round"
    echo "== set $i round $round, $agents agents: $extra" | tee -a "$OUT/ab.txt"
    MLXD_TRACE="$OUT/trace-$run.jsonl" python3 -m mlxd bench serve --model "$model" \
      --agents "$agents" --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600 \
      --batch "${BATCH:-32}" --mlxd-args "$extra" --only mlxd --json "$OUT/ab-$run.json" \
      2>&1 | grep -E "^\| [0-9]|round" | tee -a "$OUT/ab.txt"
    { python3 -m bench.probes.trace_report "$OUT/trace-$run.jsonl" \
      | grep -E "rows:|'batched'" || true; } | tee -a "$OUT/ab.txt"
    python3 bench/h200/failed_rounds.py "$OUT/ab-$run.json" | tee -a "$OUT/ab.txt"
    i=$((i + 1))
  done
done
# At most 8 files come back from a call: the traces and the JSONs travel as one archive each
# (sent as a file per trace, 5 of 6 were lost).
cd "$OUT"
for kind in trace ab; do
  ext=$([ $kind = trace ] && echo jsonl || echo json)
  if ls $kind-*.$ext >/dev/null 2>&1; then
    tar -czf "$kind-${tag}all.tar.gz" $kind-*.$ext && rm -f $kind-*.$ext
  fi
done
