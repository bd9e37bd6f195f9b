#!/usr/bin/env bash
# join_kernels.sh SHAPE ROWS: probe_join --kernels at the 256-token fleet's two join shapes
# (turn 1: 55 new tokens over 3,609 cached; turn 2: 332 over 3,900), the folded+fused model,
# cuDNN's attention on and off (CUDNN), over mlx-lm's row caches and mlxd's (CACHES, default
# "mlx mlxd": mlxd's roll kernel and additive prefill mask): each part's wall time in three repeats (new lengths, others,
# the same again) and the last repeat's merge, prefill, roll and first step kernel by kernel.
# JOIN_SHAPES overrides the shapes ("CACHED NEW" per line). Output: $OUT/join-kernels.txt.
set -uo pipefail
source bench/h200/setup.sh || exit 1
shape=$1 rows=$2
while read -r cached new; do
  for cudnn in ${CUDNN:-1 0}; do
    for caches in ${CACHES:-mlx mlxd}; do
      echo "== $shape, $rows rows, $new new over $cached cached, cuDNN attention $cudnn," \
        "$caches caches" | tee -a "$OUT/join-kernels.txt"
      MLX_CUDA_USE_CUDNN_SDPA=$cudnn timeout "${JOIN_TIMEOUT:-200}" python3 -m bench.probes.probe_join \
        --shape "$shape" --rows "$rows" --cached "$cached" --new "$new" --caches "$caches" \
        --attention "${ATTENTION:-folded+fused}" --kernels --top "${TOP:-15}" 2>&1 \
        | grep -v Warning | tee -a "$OUT/join-kernels.txt"
    done
  done
done <<< "${JOIN_SHAPES:-"3609 55
3900 332"}"
