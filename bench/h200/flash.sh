#!/usr/bin/env bash
# flash.sh: --batched-attention flash (mlxd/model/decode_kernel.py) on the H200: its tests on
# MLX-CUDA (carry .whlT), then probe_flash's tiling sweep (error against float32, time against
# folded) at the 0.6B and 8B shapes; the fastest tiling at 0.6B x 32 rows x 4k is then used
# (MLXD_FLASH_TILING) for probe_ops (folded+fused against flash+fused, graphs off) and, when
# FLEET=N rounds is set and flash's step is the faster, the 32-agent fleet against mlx_lm.server.
set -uo pipefail
source bench/h200/setup.sh || exit 1
TESTS_TIMEOUT=120 bash bench/h200/cuda_tests.sh tests/model/test_decode_kernel.py | tail -3
T="2,4,1056 1,4,1056 4,4,1056 2,8,1056 4,8,1056 2,4,2112 4,4,2112 2,2,1056"
python3 -m bench.probes.probe_flash --shape qwen3-0.6b --rows 32 8 --contexts 4096 512 \
  --tilings $T | tee "$OUT/flash-0.6b.txt"
python3 -m bench.probes.probe_flash --shape qwen3-8b --rows 32 --contexts 4096 --tilings $T \
  | tee "$OUT/flash-8b.txt"
best=$(head -1 "$OUT/flash-0.6b.txt" | grep -oE '[0-9]+,[0-9]+,[0-9]+: +[0-9.]+ ms' \
  | sort -t: -k2 -n | head -1 | cut -d: -f1)
echo "fastest tiling at 0.6B x 32 x 4096: $best" | tee -a "$OUT/flash-ops.txt"
export MLXD_FLASH_TILING=$best
MLX_USE_CUDA_GRAPHS=0 python3 -m bench.probes.probe_ops --shape qwen3-0.6b --rows 32 \
  --context 4096 --modes folded+fused flash+fused | cut -c1-90 | tee -a "$OUT/flash-ops.txt"
ms() { grep "^$1 " "$OUT/flash-ops.txt" | grep -oE 'build\+eval +[0-9.]+' | grep -oE '[0-9.]+$'; }
if [ -n "${FLEET:-}" ] && python3 -c "import sys; sys.exit(not $(ms flash+fused) < $(ms folded+fused))"; then
  python3 -m mlxd bench serve --model "$(model_dir qwen3-0.6b)" --agents 32 --turns 2 --warmup 8 \
    --max-tokens 256 --system-tokens 3600 --batch 32 --rounds "$FLEET" \
    --mlxd-args "--batched-attention flash+fused --cuda-graphs off" --json "$OUT/fleet-flash.json" \
    --plot "$OUT/fleet-flash.png" 2>&1 | tee "$OUT/fleet-flash.txt" | tail -12
fi
