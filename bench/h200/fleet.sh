#!/usr/bin/env bash
# fleet.sh SHAPE AGENTS [MLXD_ARGS]: e.g. fleet.sh qwen3-0.6b 1,8,32 "--batched-attention folded";
# BATCH=8 runs mlxd at its default --batch instead of 32; BASELINE=1 adds generate_step alone
# (the 1-agent ITL bound), TEMP=0.7 sampled agents, ROUNDS=3 three runs per N; RUN=2
# names a repeat's files apart; INTERLEAVE=1 keeps both servers up and alternates them by round;
# CACHE_GB=20 caps MLX's buffer cache in both servers (two 8B servers on one GPU).
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=${3:---batched-attention folded}
tag=$(echo "$shape-$agents-b${BATCH:-32}-t${TEMP:-0}-$extra${RUN:+-r$RUN}" | tr -c 'A-Za-z0-9.\n-' '_')
python3 -m mlxd bench serve --model "$(model_dir "$shape")" --agents "$agents" --turns 2 \
  --warmup 8 --max-tokens 256 --system-tokens 3600 --batch "${BATCH:-32}" --mlxd-args "$extra" --rounds "${ROUNDS:-1}" \
  ${BASELINE:+--baseline} ${INTERLEAVE:+--interleave} ${CACHE_GB:+--cache-limit-gb $CACHE_GB} --temperature "${TEMP:-0}" \
  --json "$OUT/fleet-$tag.json" --plot "$OUT/fleet-$tag.png" 2>&1 | tee "$OUT/fleet-$tag.txt"
