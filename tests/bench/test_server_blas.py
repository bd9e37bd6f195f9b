"""`mlxd bench serve` compares two servers on one BLAS: with an optimized one loaded here
(MLXD_BLAS=auto), both children preload it, so a stock mlx_lm.server computes mlxd's bits."""

import subprocess
import sys
from pathlib import Path

import pytest

from mlxd import blas
from mlxd.bench.servers import Server, free_port


def test_both_servers_get_this_process_blas(tmp_path: Path, monkeypatch) -> None:
    fake = str(tmp_path / "libopenblas.so.0")
    monkeypatch.setattr(blas, "_global_cblas", lambda: fake)
    monkeypatch.setattr(sys, "platform", "linux")
    seen: list[dict] = []

    class Spy:
        def __init__(self, cmd, stdout=None, stderr=None, env=None) -> None:
            seen.append(env)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    Server("mlx_lm", ["mlx_lm.server"], free_port(), tmp_path).start()
    assert seen[0]["LD_PRELOAD"].split()[0] == fake


def test_on_the_reference_blas_nothing_is_preloaded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(blas, "_global_cblas", lambda: None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    seen: list[dict] = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, env=None, **kw: seen.append(env))
    Server("mlx_lm", ["mlx_lm.server"], free_port(), tmp_path).start()
    assert "LD_PRELOAD" not in seen[0]


pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="Linux's dynamic linker")
