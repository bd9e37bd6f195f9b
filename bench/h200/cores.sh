#!/usr/bin/env bash
# cores.sh: the machine's CPU and GPU topology, then the decode step timed with its thread pinned
# to each CPU in turn (probe_cores, graphs off as the fleet runs), then the HTTP side alone on a
# paced engine (probe_http) at Python's default switch interval and at 1 ms.
set -uo pipefail
source bench/h200/setup.sh
M=$(model_dir qwen3-0.6b)
{
  nproc; lscpu | head -30; cat /sys/fs/cgroup/cpu.max 2>/dev/null
  nvidia-smi topo -m 2>/dev/null
  for g in /proc/driver/nvidia/gpus/*; do
    bus=$(basename "$g" | tr 'A-Z' 'a-z'); echo "gpu $bus local_cpulist $(cat /sys/bus/pci/devices/$bus/local_cpulist 2>/dev/null) numa $(cat /sys/bus/pci/devices/$bus/numa_node 2>/dev/null)"
  done
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "$(basename $c) siblings $(cat $c/topology/thread_siblings_list) pkg $(cat $c/topology/physical_package_id) mhz $(cat $c/cpufreq/scaling_cur_freq 2>/dev/null)"
  done
} > "$OUT/topology.txt" 2>&1
cat "$OUT/topology.txt" | head -80
MLX_USE_CUDA_GRAPHS=0 python3 -m bench.probes.probe_cores --shape qwen3-0.6b --rows 1 32 \
  --context 4096 --steps 20 --passes 3 | tee "$OUT/cores.txt"
for si in "" 0.001; do
  python3 -m bench.probes.probe_http --model "$M" --streams 32 --tokens 256 --step-ms 10 \
    ${si:+--switch-interval $si} | tee -a "$OUT/http.txt"
done
