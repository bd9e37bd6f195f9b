#!/usr/bin/env bash
# cudnn.sh SHAPE AGENTS "MLXD_ARGS": the mixed-length fleet (--min-tokens MIN, default 128, of
# 256: each agent's next turn arrives alone, a prefill of 1-2 rows at a shape not seen before)
# with MLX's cuDNN attention for prefill and without (MLX_CUDA_USE_CUDNN_SDPA=0: MLX's own
# kernels, other bits: a probe), mlxd alone, ROUNDS (default 1) alternations, MLXD_TRACE with
# each join's parts (the forward pass per shape) in cudnn.txt.
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=$3
model=$(model_dir "$shape")
for round in $(seq 1 "${ROUNDS:-1}"); do
  for on in 0 1; do  # off first: the fresh machine's JIT costs land on the probe, not on cuDNN
    echo "== MLX_CUDA_USE_CUDNN_SDPA=$on round $round" | tee -a "$OUT/cudnn.txt"
    MLX_CUDA_USE_CUDNN_SDPA=$on MLXD_TRACE="$OUT/trace-cudnn$on-$round.jsonl" python3 -m mlxd \
      bench serve --model "$model" --agents "$agents" --turns 2 --warmup 8 --max-tokens 256 \
      --min-tokens "${MIN:-128}" --system-tokens 3600 --batch "${BATCH:-32}" --mlxd-args "$extra" \
      --only mlxd --seed "$round" 2>&1 | grep -E "^\| [0-9]|round [0-9]" | tee -a "$OUT/cudnn.txt"
    python3 - "$OUT/trace-cudnn$on-$round.jsonl" <<'PY' | tee -a "$OUT/cudnn.txt"
import json, statistics as st, sys
turns = [json.loads(x) for x in open(sys.argv[1])]
fw = [t["parts"]["forward"] for t in turns if "forward" in t.get("parts", {})]
print(f"joins {len(fw)}: forward median {st.median(fw):.3f} s, max {max(fw):.3f}, sum {sum(fw):.2f}")
PY
  done
done
cd "$OUT" && tar czf cudnn-traces.tar.gz trace-cudnn*.jsonl && rm -f trace-cudnn*.jsonl
