#!/usr/bin/env bash
# rows1.sh [SHAPES]: a lone row's step over 2-D rows (model/plain_rows.py, the default) against
# mlx-lm's model call (--decode-step mlx), mlx-lm's stream_generate and the stacked projections
# (--decode-step rows+fused), the four alternated round by round in one process
# (probe_overhead), per shape (default: qwen3-0.6b qwen3-8b);
# ROUNDS=12. Then the mlx mode's batched 0.6B step at 2 and 8 rows (probe_ops, alternated).
set -euo pipefail
source bench/h200/setup.sh
for shape in ${1:-qwen3-0.6b qwen3-8b}; do
  echo "== $shape, 512-token prompt, 128 tokens a round" | tee -a "$OUT/rows1.txt"
  python3 -m bench.probes.probe_overhead --shape "$shape" --rounds "${ROUNDS:-12}" \
    --prompt-tokens 512 --gen-tokens 128 2>&1 | tee -a "$OUT/rows1.txt"
done
# The mlx mode's batched step, mlx-lm's 3-D step against mlxd's over rows, alternated by block.
python3 -m bench.probes.probe_ops --shape qwen3-0.6b --rows 2 8 --context 1024 --steps 10 \
  --modes mlx/3d mlx --alternate 20 2>&1 | tee -a "$OUT/rows1.txt"
