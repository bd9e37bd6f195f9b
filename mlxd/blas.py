"""An optimized CBLAS for MLX's Linux CPU backend, loaded before anything imports mlx.

MLX's Linux CPU wheel links the reference BLAS it vendors (`mlx_cpu.libs/libblas-*.so`):
a 2048x2048 float32 matmul runs at ~8 GFLOP/s with it and ~250 with the distribution's
OpenBLAS. A library loaded RTLD_GLOBAL before `libmlx.so` comes first in the dynamic linker's
symbol lookup, so MLX's `cblas_sgemm` calls resolve to it; loaded after, it changes nothing.
`mlxd/__init__.py` calls `preload()` on its first line. `MLXD_BLAS` (mlxd/config.py) picks:
`reference` (the default: MLX's own), `auto` (the first optimized BLAS found) or a path.

Opt-in, because an optimized BLAS changes bits: against a stock mlx-lm process, and between a
row run alone and the same row in a batch (its sgemm blocks by the row count), which the
reference BLAS keeps equal on the CPU as MLX's GPU kernels do for mlx-lm's batches.
"""

import ctypes
import ctypes.util
import logging
import os
import platform
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from importlib import metadata

from .config import blas_choice

log = logging.getLogger(__name__)

# Sonames in preference order: OpenBLAS (measured), BLIS, then MKL's single dynamic library.
SONAMES = (
    "libopenblas.so.0",
    "libopenblasp.so.0",  # Fedora's pthread build
    "libopenblaso.so.0",  # Fedora's OpenMP build
    "libblis.so.4",
    "libblis.so.3",
    "libmkl_rt.so.2",
    "libmkl_rt.so",
)
FIND_LIBRARY_NAMES = ("openblas", "openblasp", "blis", "mkl_rt")
CUDA_DISTRIBUTIONS = ("mlx-cuda-13", "mlx-cuda-12", "mlx-cuda")  # what `mlx[cuda]` installs
REFERENCE = "MLX's bundled reference BLAS"

_loaded: str | None = None  # the path preload() loaded
_why = "not looked for yet"  # why the reference BLAS runs, when it does


def _search_dirs() -> list[str]:
    """The usual library folders of Debian/Ubuntu (multiarch), Fedora (lib64) and /usr/local."""
    arch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    dirs = []
    for root in (f"/usr/lib/{arch}", f"/lib/{arch}"):
        dirs.append(root)
        # Debian's alternatives keep each build in its own folder.
        dirs += [f"{root}/{sub}" for sub in ("openblas-pthread", "openblas-openmp", "blis-pthread")]
    return dirs + ["/usr/lib64", "/usr/lib", "/usr/local/lib64", "/usr/local/lib"]


def _ldconfig_paths() -> dict[str, str]:
    """soname -> path from the linker cache (`ldconfig -p`); empty where there is none."""
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        try:  # not on PATH for a non-root user on Debian
            out = subprocess.run(
                ["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=5, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
    found: dict[str, str] = {}
    for line in out.splitlines():
        name, _, path = line.strip().partition(" => ")
        found.setdefault(name.split(" ", 1)[0], path.strip())
    return found


def candidates() -> list[str]:
    """Optimized CBLAS libraries on this machine, the preferred first (paths, deduplicated)."""
    out: list[str] = []
    seen: set[str] = set()

    def add(path: str | None) -> None:
        if path and os.path.exists(path) and os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            out.append(path)

    dirs = _search_dirs()
    for soname in SONAMES:
        for d in dirs:
            add(os.path.join(d, soname))
    cache = _ldconfig_paths()
    for soname in SONAMES:
        add(cache.get(soname))
    if not out:  # LD_LIBRARY_PATH and other linker paths only find_library knows
        for name in FIND_LIBRARY_NAMES:
            found = ctypes.util.find_library(name)
            add(found if found and os.sep in found else _resolve(found))
    return out


def _resolve(soname: str | None) -> str | None:
    return None if soname is None else _ldconfig_paths().get(soname)


def _cuda_backend() -> bool:
    """An MLX CUDA backend is installed (`mlx[cuda]`): the GPU runs the model, leave it be."""
    for name in CUDA_DISTRIBUTIONS:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        return True
    return False


def _load(path: str) -> bool:
    """Load `path` RTLD_GLOBAL if it exports cblas_sgemm unprefixed; False, logged, if not."""
    try:
        if not hasattr(ctypes.CDLL(path, mode=os.RTLD_LOCAL), "cblas_sgemm"):
            log.debug("BLAS %s has no cblas_sgemm: not loaded", path)
            return False
        ctypes.CDLL(path, mode=os.RTLD_GLOBAL)  # promotes the handle opened above
    except OSError as e:
        log.debug("BLAS %s did not load: %s", path, e)
        return False
    return True


def preload() -> None:
    """Load an optimized CBLAS for MLX's CPU backend, per MLXD_BLAS. Never raises: a failure
    leaves MLX's own BLAS in place and says why in a debug log and in `blas_in_use()`."""
    global _loaded, _why
    if _loaded is not None or _why != "not looked for yet":
        return
    choice = blas_choice()
    if "mlx.core" in sys.modules:
        _why = "mlx was imported before mlxd, too late to load another"
    elif sys.platform != "linux":
        _why = "not Linux"
    elif choice == "reference":
        _why = "MLXD_BLAS=reference, the default; MLXD_BLAS=auto loads an optimized one"
    elif _cuda_backend():
        _why = "MLX's CUDA backend is installed"
    else:
        try:
            paths = candidates() if choice == "auto" else [choice]
            _loaded = next((p for p in paths if _load(p)), None)
        except Exception as e:  # noqa: BLE001 - importing mlxd must never fail on this
            log.debug("BLAS search failed: %r", e)
            paths = []
        if _loaded is None and choice != "auto":
            _why = f"MLXD_BLAS={choice} did not load"
        elif _loaded is None:
            _why = "none of OpenBLAS, BLIS or MKL loaded" if paths else "no optimized BLAS found"
    if _loaded is None:
        log.debug("BLAS: %s (%s)", REFERENCE, _why)


def _version(lib: ctypes.CDLL) -> str | None:
    """The library's own name for itself, where it has a function for it."""
    for fn in ("openblas_get_config", "bli_info_get_version_str"):
        if hasattr(lib, fn):
            getattr(lib, fn).restype = ctypes.c_char_p
            text = getattr(lib, fn)().decode(errors="replace")
            return text if fn == "openblas_get_config" else f"BLIS {text}"
    if hasattr(lib, "MKL_Get_Version_String"):
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(buf, len(buf))
        return buf.value.decode(errors="replace").strip()
    return None


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _global_cblas() -> str | None:
    """The file the process-wide lookup finds cblas_sgemm in, or None. MLX's calls go there:
    global libraries (ours, or LD_PRELOAD's) come before libmlx's own dependencies."""
    try:
        process = ctypes.CDLL(None)
        fn, dladdr = process.cblas_sgemm, process.dladdr
    except (OSError, AttributeError):
        return None
    info = _DlInfo()
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if not dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def blas_in_use() -> str:
    """Which BLAS MLX's CPU backend calls, in one line (for `--help` and the start-up log)."""
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    path = _global_cblas()
    if path is None or "mlx_cpu.libs" in path:
        return f"{REFERENCE} ({_why})"
    try:
        name = _version(ctypes.CDLL(path, mode=os.RTLD_GLOBAL))
    except OSError:
        name = None
    return f"{name or os.path.basename(path)} ({path})"


def same_blas(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a child process that runs a stock mlx-lm (mlx_lm.server, `python -m mlx_lm`):
    LD_PRELOAD puts this process's optimized BLAS first there too, so both compute the same
    float32 bits. Unchanged on the reference BLAS."""
    out = dict(env)
    path = _global_cblas()
    if path is not None and "mlx_cpu.libs" not in path and sys.platform == "linux":
        out["LD_PRELOAD"] = " ".join(filter(None, [path, out.get("LD_PRELOAD")]))
    return out
