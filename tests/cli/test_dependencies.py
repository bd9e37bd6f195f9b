"""A plain install runs every command: each package mlxd imports is one of its base
dependencies (or theirs), except the few a single flag needs, which fail as one line."""

import ast
import importlib.metadata as md
import json
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mlxd.cli import main

ROOT = Path(__file__).resolve().parents[2]
# Imported only behind one flag, each checked when that flag is given.
OPTIONAL = {
    "matplotlib": "mlxd bench serve --plot (the bench extra)",
    "PIL": "mlxd generate --image, on a vision model (Pillow reads the image)",
    "torch": "MLXD_KERNELS, a profiling aid on CUDA (PyTorch's profiler)",
    "mlx_vlm": "vision-language models (the vision extra), once a config.json has a vision_config",
}


def _closure(requirements: list[str]) -> set[str]:
    """The distributions a plain `pip install .` brings: the base list, then what each
    installed one requires for the extras asked of it, markers evaluated here."""
    seen: set[str] = set()
    todo = [(Requirement(r), frozenset()) for r in requirements]
    while todo:
        req, asked = todo.pop()
        envs = [{"extra": e} for e in asked or {""}]
        if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
            continue
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            subs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # not installed here (another platform's): nothing imports it here either
        todo += [(Requirement(s), frozenset(req.extras)) for s in subs]
    return {k.split("[")[0] for k in seen}


def _imported_packages() -> dict[str, str]:
    """Top-level third-party module → one file of mlxd importing it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "mlxd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "mlxd":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_comes_with_a_plain_install() -> None:
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    closure = _closure(base)
    owners = md.packages_distributions()
    missing = {
        module: where
        for module, where in _imported_packages().items()
        if module not in OPTIONAL
        and not {canonicalize_name(d) for d in owners.get(module, [module])} & closure
    }
    assert not missing, f"imported but not a dependency of `pip install .`: {missing}"


def test_plot_without_matplotlib_is_one_line_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mlxd.bench.serve as bench_serve

    def never(*_a: object) -> int:
        raise AssertionError("the benchmark ran without what --plot needs")

    monkeypatch.setattr(bench_serve, "run_serve", never)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--agents", "1", "--plot", "out.png"])
    message = str(e.value.code)
    assert "\n" not in message and "--plot needs matplotlib" in message
    assert f"{sys.executable} -m pip install 'matplotlib" in message


def test_a_vision_folder_without_the_vision_extra_is_not_taken_for_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without mlx-vlm a folder with a vision_config goes the text path, as mlx-lm loads it."""
    from mlxd.model.vision.load import is_vision_folder

    config = {"model_type": "gemma3", "vision_config": {"model_type": "siglip_vision_model"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert is_vision_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "mlx_vlm", None)  # import mlx_vlm → ImportError
    monkeypatch.setitem(sys.modules, "mlx_vlm.utils", None)
    assert not is_vision_folder(tmp_path)
