#!/usr/bin/env bash
# held_ab.sh SHAPE AGENTS "MLXD_ARGS": with --switch-interval engine, a batched step's readers
# woken as the next step is queued (MLXD_HELD_WAKE=1, engine/gil.py's HeldWake) against at once
# (0), mlxd alone, ROUNDS (default 3) alternations of one round each with MLXD_TRACE and an
# engine window per round (KERNELS_AT, default "32 60 40"; KERNELS_AT= turns it off): tok/s,
# TTFT, the step lines and the window's host parts (build, encode, the rest) in held-ab.txt.
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=$3
[[ "$extra" == *"--switch-interval engine"* ]] || extra="$extra --switch-interval engine"
model=$(model_dir "$shape")
work=(--agents "$agents" --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600
  --batch "${BATCH:-32}" --mlxd-args "$extra")
python3 -m mlxd bench serve --model "$model" "${work[@]}" --only mlxd >/dev/null 2>&1 || true
KERNELS_AT=${KERNELS_AT-32 60 40} ROUNDS=${ROUNDS:-3} env_ab MLXD_HELD_WAKE "0 1" held-ab.txt "$model" "${work[@]}"
cd "$OUT" && tar czf "held-ab-traces-$shape.tar.gz" trace-*.jsonl env-*.json \
  && rm -f trace-*.jsonl env-*.json && mv held-ab.txt "held-ab-$shape-$agents.txt"
