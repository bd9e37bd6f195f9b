#!/usr/bin/env bash
# clear_ab.sh SHAPE N: mlxd alone, --prefill-clear-cache on (mlx-lm's clears) then auto (none on
# CUDA), folded attention, graphs off, --batch 32; the same prompts (seed 0) for both.
set -euo pipefail
source bench/h200/setup.sh
model=$(model_dir "$1")
for mode in on auto; do
  python3 -m mlxd bench serve --model "$model" --agents "$2" --turns 2 --warmup 8 --max-tokens 256 \
    --system-tokens 3600 --batch 32 --only mlxd --seed 0 \
    --mlxd-args "--batched-attention folded --cuda-graphs off --prefill-clear-cache $mode" \
    --json "$OUT/clear-$mode-$1-$2.json" 2>&1 | grep -v "^\[transformers\]" | tail -5
done | tee "$OUT/clear-ab-$1-$2.txt"
