"""`import mlxd` loads an optimized CBLAS before mlx on Linux (mlxd/blas.py, MLXD_BLAS).

Each case runs in a fresh interpreter: the BLAS can be chosen only before mlx is first imported.
"""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _cuda_installed() -> bool:
    from mlxd.blas import _cuda_backend

    return _cuda_backend()


# The CPU backend's BLAS: with MLX's CUDA backend installed it is never touched (tested below).
pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or _cuda_installed(), reason="MLX's Linux CPU backend only"
)

ROOT = Path(__file__).resolve().parents[1]

# Where Debian/Ubuntu and Fedora put OpenBLAS (`apt-get install libopenblas0-pthread`).
OPENBLAS = sorted(
    p
    for pattern in ("/usr/lib/*-linux-gnu/libopenblas.so.0", "/usr/lib64/libopenblas*.so.0")
    for p in glob.glob(pattern)
)
needs_openblas = pytest.mark.skipif(not OPENBLAS, reason="no OpenBLAS installed")

# A float32 matmul checked against numpy in float64, its time, and what the process mapped.
MATMUL = """
import json, logging, sys, time
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
import mlxd
import mlx.core as mx
import numpy as np
n = int(sys.argv[1])
rng = np.random.default_rng(0)
a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
x, y = mx.array(a), mx.array(b)
mx.eval(x @ y)
t = time.perf_counter()
out = x @ y
mx.eval(out)
seconds = time.perf_counter() - t
err = float(np.abs(np.array(out) - a.astype(np.float64) @ b.astype(np.float64)).max())
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "/" in line})
print(json.dumps(dict(blas=mlxd.blas_in_use(), seconds=seconds, err=err, maps=maps)))
"""


def _run(code: str, *args: str, blas: str | None, preload: str | None = None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLXD_BLAS", "LD_PRELOAD")}
    if blas is not None:
        env["MLXD_BLAS"] = blas
    if preload is not None:
        env["LD_PRELOAD"] = preload
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _maps_lib(maps: list[str], path: str) -> bool:
    return os.path.realpath(path) in {os.path.realpath(m) for m in maps}


@needs_openblas
def test_a_given_path_is_loaded_and_multiplies_correctly() -> None:
    out, _ = _run(MATMUL, "256", blas=OPENBLAS[0])
    assert _maps_lib(out["maps"], OPENBLAS[0])
    assert out["err"] < 1e-3
    assert out["blas"].startswith("OpenBLAS") and OPENBLAS[0] in out["blas"]


@needs_openblas
def test_mlx_matmuls_run_on_the_loaded_blas() -> None:
    """Mapped is not enough: MLX's cblas_sgemm must resolve to it. A 1024^2 float32 matmul is
    ~20-40x faster on OpenBLAS than on the reference BLAS (even on one free core)."""
    fast, _ = _run(MATMUL, "1024", blas=OPENBLAS[0])
    slow, _ = _run(MATMUL, "1024", blas="reference")
    assert fast["err"] < 1e-2 and slow["err"] < 1e-2
    assert slow["seconds"] > 4 * fast["seconds"], (fast, slow)


@needs_openblas
def test_reference_loads_nothing() -> None:
    out, _ = _run(MATMUL, "64", blas="reference")
    assert not any(_maps_lib(out["maps"], p) for p in OPENBLAS)
    assert out["blas"].startswith("MLX's bundled reference BLAS (MLXD_BLAS=reference")
    assert any("mlx_cpu.libs/libblas" in m for m in out["maps"])


def test_a_bad_path_is_a_debug_log_and_the_reference_blas(tmp_path: Path) -> None:
    not_a_library = tmp_path / "libopenblas.so.0"
    not_a_library.write_text("not an ELF file")
    for path in (str(not_a_library), str(tmp_path / "missing.so")):
        out, stderr = _run(MATMUL, "64", blas=path)
        assert out["blas"] == f"MLX's bundled reference BLAS (MLXD_BLAS={path} did not load)"
        assert out["err"] < 1e-3
        assert f"mlxd.blas DEBUG BLAS {path} did not load" in stderr
        assert "WARNING" not in stderr and "ERROR" not in stderr and "Traceback" not in stderr


@needs_openblas
def test_auto_finds_the_distributions_openblas() -> None:
    out, _ = _run(MATMUL, "64", blas="auto")
    assert out["blas"].startswith("OpenBLAS"), out["blas"]


def test_the_default_is_the_reference_blas() -> None:
    """Unset, MLX's own BLAS runs: a stock mlx-lm's bits, and a row's bits alone or batched."""
    out, _ = _run(MATMUL, "64", blas=None)
    assert out["blas"].startswith("MLX's bundled reference BLAS (MLXD_BLAS=reference")
    assert not any(_maps_lib(out["maps"], p) for p in OPENBLAS)


@needs_openblas
def test_never_with_mlxs_cuda_backend_installed(tmp_path: Path) -> None:
    """`mlx[cuda]` installs mlx-cuda-13: the GPU runs the model, the CPU BLAS is left alone."""
    dist = tmp_path / "mlx_cuda_13-0.32.4.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlx-cuda-13\nVersion: 0.32.4\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + MATMUL
    out, _ = _run(code, "64", blas="auto")
    assert out["blas"] == "MLX's bundled reference BLAS (MLX's CUDA backend is installed)"
    assert not any(_maps_lib(out["maps"], p) for p in OPENBLAS)


@needs_openblas
def test_blas_in_use_tells_what_mlx_calls_when_mlx_came_first() -> None:
    """Imported after mlx, mlxd loads nothing and says so; a BLAS preloaded by the dynamic
    linker (LD_PRELOAD, as for a stock mlx_lm.server) is named, since MLX calls it."""
    code = "import mlx.core\n" + MATMUL
    out, _ = _run(code, "64", blas="auto")
    assert out["blas"] == (
        "MLX's bundled reference BLAS (mlx was imported before mlxd, too late to load another)"
    )
    out, _ = _run(code, "64", blas=None, preload=OPENBLAS[0])
    assert out["blas"].startswith("OpenBLAS") and OPENBLAS[0] in out["blas"]


def test_mlxd_config_imports_no_mlx() -> None:
    """mlxd/config.py is read before the BLAS loads, so it must not import mlx (nor mlx_lm)."""
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('cfg', 'mlxd/config.py')\n"
        "cfg = importlib.util.module_from_spec(spec)\n"
        "sys.modules['cfg'] = cfg\n"
        "spec.loader.exec_module(cfg)\n"
        "import json\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm'))))"
    )
    out, _ = _run(code, blas=None)
    assert out == []


def test_config_keeps_mlx_lms_defaults() -> None:
    from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START
    from mlx_lm.utils import _parse_size

    from mlxd import config

    assert config.DEFAULT_QUANTIZED_KV_START == DEFAULT_QUANTIZED_KV_START
    for text in ("32GB", "1.5G", "700MB", "4096"):
        assert config._parse_size(text) == _parse_size(text)
