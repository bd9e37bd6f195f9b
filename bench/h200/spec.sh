#!/usr/bin/env bash
# spec.sh: speculative decoding on the embedded SmolLM2-135M-Instruct (real weights, so the
# acceptance is real): the edit workload (mlx_lm.server, mlxd, mlxd --speculative ngram) and the
# prose fleet (mlxd against mlxd --speculative ngram) at AGENTS (default 1,8,32). The model folder
# travels in three parts (.whlM1, .whlM2 in calls of their own, .whlM3 with .whlE/.whlB): see
# README.md. FILE: the edit workload's file tokens (default 2000). EDIT_ONLY=mlxd leaves
# mlx_lm.server out of the edit workload; PROSE=0 skips the prose fleet.
set -euo pipefail
source bench/h200/setup.sh
M=/root/smollm2
if [ ! -f $M/config.json ]; then
  [ -d .whlM3 ] && cp .whlM3/* /root/whl/mdl/
  cat /root/whl/mdl/part0* > /tmp/smol.tar && mkdir -p $M && tar -C $M --strip-components=1 -xf /tmp/smol.tar
fi
agents=${AGENTS:-1,8,32}
spec="spec=--speculative ngram"
only=()
[ -n "${EDIT_ONLY:-}" ] && only=(--only "$EDIT_ONLY")
python3 -m mlxd bench serve --model $M --workload edit --agents "$agents" --file-tokens "${FILE:-2000}" \
  "${only[@]}" --warmup 8 --mlxd-variant "$spec" --json "$OUT/edit.json" --markdown "$OUT/edit.md" 2>&1 | tee "$OUT/edit.txt"
[ "${PROSE:-1}" = 0 ] && exit 0
python3 -m mlxd bench serve --model $M --agents "${PROSE_AGENTS:-$agents}" --turns 2 --max-tokens 256 --warmup 8 \
  --only mlxd --mlxd-variant "$spec" --json "$OUT/prose.json" --markdown "$OUT/prose.md" 2>&1 | tee "$OUT/prose.txt"
