#!/usr/bin/env bash
# rows1.sh [SHAPES]: a lone row's step over 2-D rows (model/plain_rows.py, the default) against
# mlx-lm's model call (--decode-step mlx) and mlx-lm's stream_generate, the three alternated
# round by round in one process (probe_overhead), per shape (default: qwen3-0.6b qwen3-8b);
# ROUNDS=12.
set -euo pipefail
source bench/h200/setup.sh
for shape in ${1:-qwen3-0.6b qwen3-8b}; do
  echo "== $shape, 512-token prompt, 128 tokens a round" | tee -a "$OUT/rows1.txt"
  python3 -m mlxd.bench.probe_overhead --shape "$shape" --rounds "${ROUNDS:-12}" \
    --prompt-tokens 512 --gen-tokens 128 2>&1 | tee -a "$OUT/rows1.txt"
done
