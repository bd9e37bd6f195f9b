"""Active memory after clear_cache: mlx-lm's generate_step alone over many prompt shapes (no mlxd)."""
import random, sys
sys.path.insert(0, "tests")
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from fixtures.tiny_models import tiny_model_dir
from pathlib import Path
import os
tok = Path(os.environ["MLXD_TEST_CACHE"]) / "tokenizer-qwen3-3.7.2"
model = load(str(tiny_model_dir("qwen3", tok, 0)))[0]
rng = random.Random(1)
def one(n, step):
    p = mx.array([rng.randrange(1, 150000) for _ in range(n)])
    list(generate_step(p, model, max_tokens=8, prefill_step_size=step))
one(10, 2048); mx.clear_cache(); base = mx.get_active_memory()
for r in range(3):
    for i in range(40):
        one(rng.randint(1, 40), rng.choice([4, 16, 2048]))
    mx.clear_cache()
    print(f"round {r}: active {mx.get_active_memory() - base:+d} bytes over baseline, cache {mx.get_cache_memory()}", flush=True)
for i in range(40):
    one(17, 16)
mx.clear_cache(); print(f"repeated shape: {mx.get_active_memory() - base:+d}", flush=True)
