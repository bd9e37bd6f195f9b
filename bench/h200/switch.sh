#!/usr/bin/env bash
# switch.sh [SHAPE] ["AGENTS"] ["MLXD ARGS"] ["SETTINGS"]: the fleet's batched step against the
# GIL's switch interval: ab.sh with Python's default 5 ms and each --switch-interval in SETTINGS
# (default "0.0002 engine"), alternated over PASSES (default 1) passes for each N in AGENTS
# (default "8 32"); mlxd alone, traced. The 32-row step measured 14.5 ms in the fleet
# against 10.9 ms in probe_ops alone, and the 8-row step 14.4 ms as well.
set -euo pipefail
shape=${1:-qwen3-0.6b}
agents=${2:-8 32}
args=${3:---batched-attention folded+fused --cuda-graphs off}
settings=${4:-0.0002 engine}
sets=("$args")
for si in $settings; do
  sets+=("$args --switch-interval $si")
done
for n in $agents; do
  TAG="$n-" ROUNDS="${PASSES:-1}" bash bench/h200/ab.sh "$shape" "$n" "${sets[@]}"
done
