#!/usr/bin/env bash
# isolation.sh [SHAPE] [AGENTS]: the engine in a child process (mlxd's default, --isolation
# process) against the same server with the engine in its own process (mlxd-inproc:
# --isolation off), the fleet workload at AGENTS (default 1,32), mlxd alone, ROUNDS (default 2)
# runs per N. INTERLEAVE=1 keeps both servers up and alternates them round by round (0.6B;
# two 8B servers do not fit one card with their caches: README.md).
set -euo pipefail
source bench/h200/setup.sh
shape=${1:-qwen3-0.6b} agents=${2:-1,32}
tag=$(echo "$shape-$agents${INTERLEAVE:+-i}" | tr -c 'A-Za-z0-9.\n-' '_')
python3 -m mlxd bench serve --model "$(model_dir "$shape")" --agents "$agents" --turns 2 \
  --warmup 8 --max-tokens 256 --system-tokens 3600 --batch 32 --only mlxd \
  --mlxd-variant "inproc=--isolation off" --rounds "${ROUNDS:-2}" ${INTERLEAVE:+--interleave} \
  --json "$OUT/isolation-$tag.json" --markdown "$OUT/isolation-$tag.md" 2>&1 | tee "$OUT/isolation-$tag.txt"
