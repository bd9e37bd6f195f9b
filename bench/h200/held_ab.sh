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
ROUNDS=${ROUNDS:-3} fleet_env_ab MLXD_HELD_WAKE "0 1" held-ab "$shape" "$agents" "$extra"
