"""Active memory after clear_cache: mlx-lm's generate_step alone over many prompt shapes."""

import os
import random
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

sys.path.insert(0, "tests")  # the tests' fixtures import only with tests/ on the path
from fixtures.tiny_models import tiny_model_dir  # noqa: E402

tok = Path(os.environ["MLXD_TEST_CACHE"]) / "tokenizer-qwen3-3.7.2"
model = load(str(tiny_model_dir("qwen3", tok, 0)))[0]
rng = random.Random(0)


def one(n: int, step: int) -> None:
    p = mx.array([rng.randrange(1, 150000) for _ in range(n)])
    list(generate_step(p, model, max_tokens=8, prefill_step_size=step))


one(10, 2048)
mx.clear_cache()
base = mx.get_active_memory()
for r in range(3):
    for _ in range(40):
        one(rng.randint(1, 40), rng.choice([4, 16, 2048]))
    mx.clear_cache()
    over, cached = mx.get_active_memory() - base, mx.get_cache_memory()
    print(f"round {r}: active {over:+d} bytes over baseline, cache {cached}", flush=True)
for _ in range(40):
    one(17, 16)
mx.clear_cache()
print(f"repeated shape: {mx.get_active_memory() - base:+d}", flush=True)
