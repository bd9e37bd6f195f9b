#!/usr/bin/env bash
# jobs.sh [SHAPE] [AGENTS]: the fleet workload at AGENTS (default 8) on one mlxd server, each
# round run alone and while a background LoRA fine-tuning job trains on the same model
# (`--during-job fine_tune`, order swapped every round), ROUNDS (default 3) rounds; JOB_HP
# overrides the job's hyperparameters (JSON, e.g. '{"batch_size": 8}'), MLXD_ARGS adds flags.
set -euo pipefail
source bench/h200/setup.sh
shape=${1:-qwen3-0.6b} agents=${2:-8}
tag=$(echo "$shape-$agents${RUN:+-r$RUN}" | tr -c 'A-Za-z0-9.\n-' '_')
python3 -m mlxd bench serve --model "$(model_dir "$shape")" --agents "$agents" --turns 2 \
  --warmup 8 --max-tokens 256 --system-tokens 3600 --only mlxd --rounds "${ROUNDS:-3}" \
  --during-job fine_tune ${JOB_HP:+--job-hyperparameters "$JOB_HP"} --mlxd-args "${MLXD_ARGS:-}" \
  --json "$OUT/jobs-$tag.json" --markdown "$OUT/jobs-$tag.md" 2>&1 | tee "$OUT/jobs-$tag.txt"
