#!/usr/bin/env bash
# ptx.sh: what a padded forward at a new shape costs, and why. The 0.6B 32-agent fleet (mlxd
# alone, MLXD_TRACE, trace_report's join lines) three times on one machine: "coldptx", the
# machine's first server (MLX-CUDA JIT-compiles kernels with NVRTC and keeps the PTX in
# /tmp/mlx/<version>/ptx); "warmptx", a second server (that cache filled); "nocudnn", with
# MLX_CUDA_USE_CUDNN_SDPA=0 (MLX's own attention for the prefill: other bits, a probe only).
# Beside each, the PTX cache's file count every 0.25 s (ptx-TAG.log). Run first on a fresh start.
source bench/h200/setup.sh
m=$(model_dir qwen3-0.6b)
run() {
  tag=$1 r=$2
  shift 2
  (while true; do echo "$(date +%s.%N) $(ls /tmp/mlx/*/ptx 2>/dev/null | wc -l)"; sleep 0.25; done) \
    >"$OUT/ptx-$tag.log" &
  P=$!
  env "$@" MLXD_TRACE="$OUT/trace-$tag.jsonl" python3 -m mlxd bench serve --model "$m" --agents 32 \
    --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600 --rounds "$r" --batch 32 \
    --mlxd-args "--batched-attention folded+fused --cuda-graphs off --switch-interval engine" \
    --only mlxd --json "$OUT/j-$tag.json" 2>&1 | grep -E "round [0-9]"
  kill $P
  python3 -m bench.probes.trace_report "$OUT/trace-$tag.jsonl" --stall 0.03 \
    | grep -E -A1 "prompt [1-9]|rows:" | grep -v "^--" >"$OUT/joins-$tag.txt"
  grep -E "parts|rows:" "$OUT/joins-$tag.txt" | head -30
  gzip "$OUT/trace-$tag.jsonl"
  echo "ptx files: $(ls /tmp/mlx/*/ptx | wc -l)"
}
run coldptx 3 A=1
run warmptx 3 A=1
run nocudnn 2 MLX_CUDA_USE_CUDNN_SDPA=0
