#!/usr/bin/env bash
# ops.sh: what the 0.6B batched step is made of (probe_ops, graphs on and off), then the
# 32-agent fleet (mlxd alone, graphs off) with py-spy samples of its server: every thread's
# non-idle stacks, then only the GIL holder's (who holds the interpreter during a step).
set -euo pipefail
source bench/h200/setup.sh
M=$(model_dir qwen3-0.6b)
python3 -m bench.probes.probe_ops --shape qwen3-0.6b --rows 1 32 --context 4096 | tee "$OUT/ops-graphs-on.txt"
MLX_USE_CUDA_GRAPHS=0 python3 -m bench.probes.probe_ops --shape qwen3-0.6b --rows 1 32 \
  --context 4096 | tee "$OUT/ops-graphs-off.txt"
python3 -m mlxd bench serve --model "$M" --agents 32 --turns 2 --warmup 8 --max-tokens 256 \
  --system-tokens 3600 --batch 32 --rounds 3 --only mlxd \
  --mlxd-args "--batched-attention folded+fused --cuda-graphs off" > "$OUT/fleet-spy.txt" 2>&1 &
bg=$!
until grep -q "round 0" "$OUT/fleet-spy.txt" 2>/dev/null; do sleep 1; done  # warm-up and round 0 done
pid=$(pgrep -f "mlxd serve" | head -1)
SPY=/tmp/site/bin/py-spy
$SPY record -p "$pid" -d 6 -r 500 --threads -f raw -o "$OUT/spy-all.txt" || true
$SPY record -p "$pid" -d 6 -r 500 --threads --gil -f raw -o "$OUT/spy-gil.txt" || true
wait $bg
tail -8 "$OUT/fleet-spy.txt"
