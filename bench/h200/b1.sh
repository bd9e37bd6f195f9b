#!/usr/bin/env bash
# b1.sh SHAPE ROUNDS: single-stream decode, mlxd vs stream_generate, alternating order.
set -euo pipefail
source bench/h200/setup.sh
python3 -m mlxd bench generate --random-shape "$1" --prompt-tokens 512 --gen-tokens 128 \
  --rounds "${2:-8}" --order alternate --json "$OUT/b1-$1.json" 2>&1 | tee "$OUT/b1-$1.txt"
