# Source on the device in call 2 (bench/h200/README.md): installs MLX-CUDA + mlx-lm + extras,
# unpacks the tokenizer to /tmp/tok, puts mlxd on PYTHONPATH, builds model folders on first use.
set -o pipefail
if [ -d .whlE ]; then  # call 2 carries the extras and the tokenizer beside .whlB
  mkdir -p /root/whl/extra && cp .whlE/*.whl /root/whl/extra/ && cp .whlE/tok.tar.xz /root/whl/
fi
if [ -f /tmp/site/.mlxd-installed ]; then  # a warm machine from an earlier call: skip the reinstall
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  source .whlB/install_mlx.sh || return 1
  touch /tmp/site/.mlxd-installed
fi
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
mkdir -p /tmp/tok && tar -C /tmp/tok -xJf /root/whl/tok.tar.xz
model_dir() {  # model_dir SHAPE -> /root/SHAPE-random (written once per machine)
  local d=/root/$1-random
  [ -f "$d/config.json" ] || python3 -m bench.probes.random_model "$d" --shape "$1" --tokenizer /tmp/tok >&2
  echo "$d"
}
env_ab() {  # env_ab VAR "VALUES" TXT MODEL BENCH_ARGS...: mlxd alone, ROUNDS (default 2)
  # alternations of VAR's values, one round each with MLXD_TRACE: the bench line and
  # trace_report's step and join lines in $OUT/TXT; traces and JSONs left in $OUT (trace-*, env-*)
  local var=$1 values=$2 txt=$OUT/$3 model=$4 round value run
  shift 4
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for value in $values; do
      run="$value-$round"
      echo "== $var=$value round $round" | tee -a "$txt"
      # KERNELS_AT="ROWS START TURNS": each kernel's GPU time over that window of the server's
      # turns (engine/kernel_window.py), appended to TXT after the round.
      env "$var=$value" MLXD_TRACE="$OUT/trace-$run.jsonl" \
        ${KERNELS_AT:+MLXD_KERNELS="$OUT/kernels-$run.txt" MLXD_KERNELS_AT="$KERNELS_AT"} \
        python3 -m mlxd bench serve \
        --model "$model" "$@" --only mlxd --seed "$round" --json "$OUT/env-$run.json" \
        2>&1 | grep -E "^\| [0-9]|round" | tee -a "$txt"
      [ -f "$OUT/kernels-$run.txt" ] && tee -a "$txt" < "$OUT/kernels-$run.txt" && rm "$OUT/kernels-$run.txt"
      python3 -m bench.probes.trace_report "$OUT/trace-$run.jsonl" | grep -E "rows:|leaving|'batched'|held|ahead|requests:" \
        | tee -a "$txt" || true
    done
  done
}
fleet_env_ab() {  # fleet_env_ab VAR "VALUES" NAME SHAPE AGENTS "MLXD_ARGS": the 256-token fleet
  # (2 turns, 3.6k system prompt), an untimed run first, then env_ab with an engine window per
  # round (KERNELS_AT, default "32 60 40"; KERNELS_AT= none); $OUT/NAME-SHAPE-AGENTS.txt and
  # the traces in NAME-traces-SHAPE.tar.gz
  local var=$1 values=$2 name=$3 shape=$4 agents=$5 extra=$6 model
  model=$(model_dir "$shape")
  local work=(--agents "$agents" --turns 2 --warmup 8 --max-tokens 256 --system-tokens 3600
    --batch "${BATCH:-32}" --mlxd-args "$extra")
  python3 -m mlxd bench serve --model "$model" "${work[@]}" --only mlxd >/dev/null 2>&1 || true
  KERNELS_AT=${KERNELS_AT-32 60 40} env_ab "$var" "$values" "$name.txt" "$model" "${work[@]}"
  (cd "$OUT" && tar czf "$name-traces-$shape.tar.gz" trace-*.jsonl env-*.json \
    && rm -f trace-*.jsonl env-*.json && mv "$name.txt" "$name-$shape-$agents.txt")
}
