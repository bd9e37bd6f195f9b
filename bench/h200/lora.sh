#!/usr/bin/env bash
# lora.sh [SHAPE]: agents spread over K (default 4) random LoRA adapters (--make-adapters), the
# fleet workload at AGENTS (default 8,32): mlx_lm.server (its per-request `adapters` path, a
# reload at each switch), mlxd (--lora-modules, agent i on lora{i % K}) and mlxd-base (the same
# agents, no adapter). Without SHAPE, the embedded SmolLM2-135M-Instruct's real weights (the
# model folder travels as spec.sh's does: README.md); with SHAPE, a random-weight folder.
# MLXD_ARGS: extra mlxd flags; ONLY=mlxd leaves mlx_lm.server out; TURNS (default 2).
set -euo pipefail
source bench/h200/setup.sh
if [ -n "${1:-}" ]; then
  M=$(model_dir "$1")
else
  M=/root/smollm2
  if [ ! -f $M/config.json ]; then
    [ -d .whlM3 ] && cp .whlM3/* /root/whl/mdl/
    cat /root/whl/mdl/part0* > /tmp/smol.tar && mkdir -p $M && tar -C $M --strip-components=1 -xf /tmp/smol.tar
  fi
fi
agents=${AGENTS:-8,32} k=${K:-4}
tag=$(echo "$(basename "$M")-$agents-k$k" | tr -c 'A-Za-z0-9.\n-' '_')
only=()
[ -n "${ONLY:-}" ] && only=(--only "$ONLY")
python3 -m mlxd bench serve --model "$M" --agents "$agents" --turns "${TURNS:-2}" --max-tokens 256 \
  --warmup 8 --make-adapters "$k" --mlxd-args "${MLXD_ARGS:-}" "${only[@]}" --log-dir /tmp/lora-logs \
  --json "$OUT/lora-$tag.json" --markdown "$OUT/lora-$tag.md" 2>&1 | tee "$OUT/lora-$tag.txt"
