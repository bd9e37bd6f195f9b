#!/usr/bin/env bash
# cuda_tests.sh [PYTEST ARGS]: the parity, engine and KV tests on MLX-CUDA (mlxd against mlx-lm
# in the same process, on the GPU). Carry .whlT too (pytest wheels, bench/h200/README.md).
set -uo pipefail
source bench/h200/setup.sh
python3 -c "import pytest, openai" 2>/dev/null || {
  python3 -m pip install -q --no-index --no-deps --target /tmp/sitet .whlT/*.whl || exit 1
  export PYTHONPATH=$PYTHONPATH:/tmp/sitet
}
export MLXD_TEST_CACHE=/root/tcache
mkdir -p "$MLXD_TEST_CACHE/tokenizer-qwen3-3.7.2" && cp /tmp/tok/* "$MLXD_TEST_CACHE/tokenizer-qwen3-3.7.2/"
[ $# -gt 0 ] || set -- tests/parity tests/engine tests/kv  # "$@" keeps -k "not kv8" one argument
timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider -rfE --durations=5 \
  "$@" 2>&1 | tee "$OUT/cuda-tests.txt" | tail -60
