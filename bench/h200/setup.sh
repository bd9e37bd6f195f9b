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
