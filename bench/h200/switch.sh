#!/usr/bin/env bash
# switch.sh [SHAPE] ["AGENTS"] ["MLXD ARGS"] ["SETTINGS"]: the fleet's batched step against the
# GIL's switch interval. mlxd alone under MLXD_TRACE, Python's default 5 ms against each
# --switch-interval in SETTINGS (default "0.0002 engine"), alternated over PASSES (default 1)
# passes for each N in AGENTS (default "8 32"): tok/s from the bench line, the decode step's
# median from trace_report. Session 22 saw the 32-row step at 14.5 ms in the fleet against
# 10.9 ms in probe_ops, and the 8-row step at 14.4 ms as well.
set -uo pipefail
source bench/h200/setup.sh || exit 1
shape=${1:-qwen3-0.6b}
agents=${2:-8 32}
args=${3:---batched-attention folded+fused --cuda-graphs off}
settings=${4:-0.0002 engine}
model=$(model_dir "$shape")
for pass in $(seq "${PASSES:-1}"); do
  for n in $agents; do
    for si in default $settings; do
      extra=$args
      [[ $si != default ]] && extra="$args --switch-interval $si"
      tag="$n-$pass-$si"
      echo "== pass $pass: $shape x $n, switch interval $si" | tee -a "$OUT/switch.txt"
      MLXD_TRACE="$OUT/trace-$tag.jsonl" python3 -m mlxd bench serve --model "$model" \
        --agents "$n" --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600 \
        --batch 32 --mlxd-args "$extra" --only mlxd 2>&1 | grep -E "^\| $n " \
        | tee -a "$OUT/switch.txt"
      python3 -m mlxd.bench.trace_report "$OUT/trace-$tag.jsonl" | grep -E "^ +$n rows" \
        | tee -a "$OUT/switch.txt"
    done
  done
done
gzip -9 "$OUT"/trace-*.jsonl
