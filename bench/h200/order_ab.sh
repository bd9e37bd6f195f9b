#!/usr/bin/env bash
# order_ab.sh SHAPE AGENTS "MLXD_ARGS": the batched step encoded a step ahead (mlx-lm's order,
# MLXD_STEP_ORDER=pipelined) against encoded after the last step is read (wait: every KV write
# in place) and with its first layers queued before that read (split; engine/step_order.py),
# ORDERS (default "pipelined wait split"), mlxd alone, ROUNDS (default 2) alternations of one
# round each with MLXD_TRACE: tok/s, TTFT, ITL and the rounds' step lines in order-ab.txt.
# Before it, unless KERNELS=0, probe_kernels times each order's step at 32 rows (graphs as in
# MLXD_ARGS).
# Each fleet round also profiles a window of its own turns (KERNELS_AT, default "32 60 40": the
# 60th to 100th turn with 32 rows; engine/kernel_window.py): GPU busy, copies, host parts.
set -euo pipefail
source bench/h200/setup.sh
shape=$1 agents=$2 extra=$3
graphs=1
[[ "$extra" == *"--cuda-graphs off"* ]] && graphs=0
mode=$(echo "$extra" | grep -oE 'attention [a-z+]+' | cut -d' ' -f2)
if [ "${KERNELS:-1}" != 0 ]; then
  MLX_USE_CUDA_GRAPHS=$graphs python3 -m bench.probes.probe_kernels --shape "$shape" --rows 32 \
    --modes "${mode:-mlx}" --orders ${ORDERS:-pipelined wait split} --repeat 2 --top 6 2>&1 | grep -v -i warn \
    | tee "$OUT/order-kernels-$shape.txt"
fi
ROUNDS=${ROUNDS:-2} fleet_env_ab MLXD_STEP_ORDER "${ORDERS:-pipelined wait split}" order-ab "$shape" "$agents" "$extra"
