#!/usr/bin/env bash
# store_ab.sh SHAPE AGENTS "MLXD_ARGS": the mixed-length fleet (--min-tokens MIN, default 128, of
# 256: rows end apart, each ending row's cache goes to the prefix store), mlxd alone, with the
# store scheduling an entry's arrays (mx.async_eval, HEAD) against waiting for them (mx.eval,
# as a copy of the tree with that one call changed), ROUNDS (default 2)
# alternations of one round each, MLXD_TRACE: decode-step and rows-leaving lines in store-ab.txt.
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=$3
model=$(model_dir "$shape")
sync=/tmp/sync-tree && rm -rf "$sync" && mkdir -p "$sync" && cp -r mlxd "$sync/"
sed -i 's/    mx.async_eval(\[v for c in cache/    mx.eval([v for c in cache/' "$sync/mlxd/store/layers.py"
grep -q "    mx.eval(\[v for c in cache" "$sync/mlxd/store/layers.py"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for way in async sync; do
    root=$PWD && [ "$way" = sync ] && root=$sync
    echo "== $way round $round" | tee -a "$OUT/store-ab.txt"
    (cd "$root" && PYTHONPATH=$root:$PYTHONPATH MLXD_TRACE="$OUT/trace-$way-$round.jsonl" python3 -m mlxd \
      bench serve --model "$model" --agents "$agents" --turns 2 --warmup 8 --max-tokens 256 \
      --min-tokens "${MIN:-128}" --system-tokens 3600 --batch "${BATCH:-32}" --mlxd-args "$extra" \
      --only mlxd --seed "$round" --json "$OUT/sa-$way-$round.json" 2>&1 \
      | grep -E "^\| [0-9]|round [0-9]" | tee -a "$OUT/store-ab.txt")  # -m puts the cwd first
    python3 -m bench.probes.trace_report "$OUT/trace-$way-$round.jsonl" \
      | grep -E "rows leaving|^ +(32|31|30|16) rows" | tee -a "$OUT/store-ab.txt" || true
  done
done
cd "$OUT" && tar czf store-ab-traces.tar.gz trace-*.jsonl sa-*.json && rm -f trace-*.jsonl sa-*.json
