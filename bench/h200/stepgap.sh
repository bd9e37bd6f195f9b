#!/usr/bin/env bash
# stepgap.sh [SHAPE] ["MLXD ARGS"]: the batched step alone (probe_ops, 32 rows x 4k keys, the
# fleet's attention mode and graph setting) beside the same step inside the 32-agent fleet (mlxd
# alone under MLXD_TRACE: trace_report's 32-row median), two passes on one machine. Measured
# apart, the fleet's step took ~12.6-13 ms where the probe's whole step took ~9.6-10 ms, on
# different machines or runs; this puts both in one call. PASSES=1 runs one pass.
set -uo pipefail
source bench/h200/setup.sh || exit 1
shape=${1:-qwen3-0.6b}
args=${2:---batched-attention folded+fused --cuda-graphs off}
mode=$(echo "$args" | grep -oE 'attention [a-z+]+' | cut -d' ' -f2)
graphs=1
[[ "$args" == *"--cuda-graphs off"* ]] && graphs=0
model=$(model_dir "$shape")
for pass in $(seq "${PASSES:-2}"); do
  echo "== pass $pass: $shape, $args" | tee -a "$OUT/stepgap.txt"
  MLX_USE_CUDA_GRAPHS=$graphs python3 -m bench.probes.probe_ops --shape "$shape" --rows 32 \
    --context 4096 --modes "${mode:-mlx}" | cut -c1-110 | tee -a "$OUT/stepgap.txt"
  MLXD_TRACE="$OUT/trace-$pass.jsonl" python3 -m mlxd bench serve --model "$model" --agents 32 \
    --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600 --batch 32 --mlxd-args "$args" \
    --only mlxd 2>&1 | grep -E "^\| 32" | tee -a "$OUT/stepgap.txt"
  python3 -m bench.probes.trace_report "$OUT/trace-$pass.jsonl" | grep -E "^ +32 rows" \
    | tee -a "$OUT/stepgap.txt"
done
gzip -9 "$OUT"/trace-*.jsonl
