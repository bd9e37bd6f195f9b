#!/usr/bin/env bash
# draft.sh: draft-model speculation on the embedded SmolLM2-135M-Instruct (real weights, in
# bfloat16) drafting for a larger target made from it (bench/probes/draft_pair.py: EXTRA more
# layers, their residual writes scaled by SCALE; the acceptance is measured and reported). The
# edit workload at AGENTS (default 1,8): mlx_lm.server --draft-model (speculative_generate_step,
# one request at a time), mlxd without a draft and mlxd --draft-model --speculative draft (every
# row drafting in the batched step); LONE=1 adds mlxd --draft-model (mlx_lm.server's one-at-a-time
# path). The model folder travels as for spec.sh (README.md). FILE: file tokens (default 600).
set -euo pipefail
source bench/h200/setup.sh
S=/root/smollm2
D=/root/smollm2-bf16
T=/root/smollm2-target
if [ ! -f $S/config.json ]; then
  [ -d .whlM3 ] && cp .whlM3/* /root/whl/mdl/
  cat /root/whl/mdl/part0* > /tmp/smol.tar && mkdir -p $S && tar -C $S --strip-components=1 -xf /tmp/smol.tar
fi
[ -f $T/config.json ] || python3 -m bench.probes.draft_pair --src $S --out $T --draft-out $D \
  --dtype bfloat16 --extra "${EXTRA:-90}" --scale "${SCALE:-0.1}"
lone=()
[ -n "${LONE:-}" ] && lone=(--mlxd-variant "lone=--draft-model $D")
python3 -m mlxd bench serve --model $T --workload edit --agents "${AGENTS:-1,8}" --file-tokens "${FILE:-600}" \
  --warmup 4 --mlx-lm-args "--draft-model $D" "${lone[@]}" \
  --mlxd-variant "spec=--draft-model $D --speculative draft" \
  --json "$OUT/draft.json" --markdown "$OUT/draft.md" 2>&1 | tee "$OUT/draft.txt"
