#!/usr/bin/env bash
# graphs.sh [SHAPE] ["ROWS ..."]: MLX-CUDA's committed CUDA graphs for a few steps of probe_ops'
# folded+fused step at each row count (1: mlx-lm's serial generate_step), dumped as dot files (MLX_SAVE_CUDA_GRAPHS_DOT_FILE, read
# once per process, so one process per row count): how many graphs, the cluster shapes that the
# kernel names carry, and the dumps in $OUT/graphs-<rows>.tar.gz. Why: docs/performance.md §4
# item 1 (a graph holding a kernel clustered in y or z is instantiated at every commit).
set -euo pipefail
source bench/h200/setup.sh
shape=${1:-qwen3-0.6b}
for rows in ${2:-1 8}; do
  d=$(mktemp -d)
  if [ "$rows" = 1 ]; then  # a lone row is mlx-lm's serial step (KVCache), not a batch of one
    MLX_SAVE_CUDA_GRAPHS_DOT_FILE="$d/g" python3 - "$shape" <<'PY'
import sys
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlxd.bench.models import build_random
bm = build_random(sys.argv[1], "bfloat16")
prompt = mx.arange(4096) % 1000
for _ in generate_step(prompt, bm.model, max_tokens=6):
    pass
print("serial: 4,096-token prompt, 6 tokens (the dumps hold the prefill too)")
PY
  else
    MLX_SAVE_CUDA_GRAPHS_DOT_FILE="$d/g" python3 -m bench.probes.probe_ops --shape "$shape" \
      --rows "$rows" --context 4096 --steps 4 --modes folded+fused
  fi
  echo "== $rows rows: $(ls "$d" | wc -l) graphs dumped; cluster shapes in kernel names:"
  cat "$d"/*.dot | grep -o 'cluster[0-9]*x[0-9]*x[0-9]*' | sort | uniq -c || echo "  (none)"
  echo "  kernel-like names, most frequent:"
  cat "$d"/*.dot | grep -oE '[A-Za-z_][A-Za-z0-9_]*(gemm|kernel|Kernel)[A-Za-z0-9_]*' \
    | sort | uniq -c | sort -rn | head -15 || true
  tar -C "$d" -czf "$OUT/graphs-$shape-$rows.tar.gz" .
done
