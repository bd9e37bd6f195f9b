"""With an optimized BLAS loaded, mlx-lm and mlxd in one process still agree bit for bit.

With MLXD_BLAS=auto `import mlxd` loads OpenBLAS before mlx (mlxd/blas.py); mlx-lm in the same
process runs on it too: one libmlx, one `cblas_sgemm`. Against a stock mlx-lm in another
process (MLX's reference BLAS) the float32 bits differ, which docs/performance.md states.
"""

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPENBLAS = sorted(Path("/usr/lib").glob("*-linux-gnu/libopenblas.so.0"))

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not OPENBLAS, reason="needs Linux and the distribution's OpenBLAS"
)

# mlxd first (it loads the BLAS), then mlx-lm: greedy streams and one forward's logits.
SCRIPT = """
import hashlib, json, sys
import mlxd
import mlx.core as mx
import mlx_lm
from parity.helpers import assert_same_run, bits, load_pair, run_stream

pair = load_pair("llama", sys.argv[1])
prompt = pair.ref_tok.encode("The lighthouse keeper counted the ships every evening")
args = dict(seed=0, max_tokens=12)
ref = run_stream(mlx_lm.stream_generate, pair.ref_model, pair.ref_tok, prompt, **args)
got = run_stream(mlxd.stream_generate, pair.got_model, pair.got_tok, prompt, **args)
assert_same_run(ref, got, "same process")
logits = pair.ref_model(mx.array([prompt]))
mx.eval(logits)
maps = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
print(json.dumps(dict(
    blas=mlxd.blas_in_use(),
    maps=sorted(maps),
    tokens=ref.tokens,
    logits=hashlib.sha256(bits(logits).tobytes()).hexdigest(),
    dtype=str(logits.dtype),
)))
"""


def _run(folder: Path, blas: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["MLXD_BLAS"] = blas
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mlx_lm_and_mlxd_share_the_loaded_blas(tiny_model: Callable[..., Path]) -> None:
    folder = tiny_model("llama")
    fast = _run(folder, str(OPENBLAS[0]))
    assert fast["blas"].startswith("OpenBLAS"), fast["blas"]
    assert os.path.realpath(OPENBLAS[0]) in {os.path.realpath(m) for m in fast["maps"]}
    assert fast["dtype"] == "mlx.core.float32"
    # A stock process (the reference BLAS) computes other float32 bits for the same model.
    stock = _run(folder, "reference")
    assert stock["blas"].startswith("MLX's bundled reference BLAS")
    assert stock["logits"] != fast["logits"]
    assert hashlib.sha256(b"").hexdigest() not in (stock["logits"], fast["logits"])


# A float32 matmul's bits, in a process that imports mlx first (a stock mlx-lm's order).
STOCK = """
import hashlib, numpy as np, mlx.core as mx
rng = np.random.default_rng(0)
a = mx.array(rng.standard_normal((256, 256), dtype=np.float32))
print(hashlib.sha256(np.array(a @ a).tobytes()).hexdigest())
"""

# mlxd's process: the same matmul, then a stock child with and without `same_blas`'s env.
PARENT = """
import json, os, subprocess, sys
import mlxd
from mlxd.blas import same_blas
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
def child(env):
    return subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True,
                          env=env, check=True).stdout.strip()
exec(sys.argv[1].replace("print(", "mine = ("))
print(json.dumps(dict(mine=mine, stock=child(env), same=child(same_blas(env)))))
"""


def test_same_blas_gives_a_stock_mlx_lm_child_this_process_bits() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXD_BLAS")}
    env["MLXD_BLAS"] = "auto"  # the opt-in: an optimized BLAS in mlxd's process
    proc = subprocess.run(
        [sys.executable, "-c", PARENT, STOCK],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["same"] == out["mine"]
    assert out["stock"] != out["mine"]  # the reference BLAS: other bits
