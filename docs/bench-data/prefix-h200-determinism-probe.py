"""Is MLX on this GPU deterministic run to run? Miss vs miss, mlxd vs mlx-lm, hit vs miss."""
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxd.engine import Engine, GenerationRequest
from mlxd.store import PrefixStore

model = load(sys.argv[1])[0]
words = mx.random.randint(1000, 20000, (3600,), key=mx.random.key(7)).tolist()
a, b = words[:3300], words[:3000] + words[3300:3600]
N, STEP = 16, 512


def mlxlm(prompt):
    gen = generate_step(mx.array(prompt), model, max_tokens=N, prefill_step_size=STEP)
    return [(int(t), lp) for t, lp in gen]


def eq(x, y):
    lp = "".join("=" if mx.array_equal(p[1], q[1]).item() else "x" for p, q in zip(x, y))
    tk = "".join("=" if p[0] == q[0] else "x" for p, q in zip(x, y))
    return f"logprobs {lp} tokens {tk}"


def eng(grid=0):
    return Engine(model, batch=1, prefill_step_size=STEP, prefix_store=PrefixStore(grid=grid),
                  namespace="x")


def run(e, p):
    h = e.submit(GenerationRequest(prompt=mx.array(p), max_tokens=N, prefill_step_size=STEP))
    return [(x.token, x.logprobs) for x in h]


r1, r2 = mlxlm(b), mlxlm(b)
print("mlx-lm miss vs mlx-lm miss:", eq(r1, r2))
e1, e2 = eng(), eng()
m1, m2 = run(e1, b), run(e2, b)
print("mlxd miss vs mlxd miss:    ", eq(m1, m2))
print("mlxd miss vs mlx-lm miss:  ", eq(m1, r1))
print("mlxd repeat (hit len-1):   ", eq(m1, run(e1, b)))
e3 = eng(STEP)
run(e3, a)
print("deterministic hit vs miss: ", eq(m1, run(e3, b)))
e4 = eng()
run(e4, a)
print("default hit vs miss:       ", eq(m1, run(e4, b)))
for e in (e1, e2, e3, e4):
    e.close()
