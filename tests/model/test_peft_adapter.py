"""PEFT adapters: the same LoRA / DoRA weights in PEFT's format load as they do in mlx-lm's.

The reference is mlx-lm's loader (load_model, load_adapters) on the mlx-lm adapter the PEFT
folder was written from (tests/fixtures/adapters.py); the PEFT folder goes through mlxd's
conversion. Parameters, token ids and logprob arrays must be identical. A bad adapter file
is a one-line ModelLoadError that names it.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from fixtures.adapters import RANK, SCALE, tiny_adapter_dir, write_peft
from mlx_lm.utils import load_adapters, load_model
from parity.helpers import PROMPT_TEXT, assert_same_parameters, assert_same_run, run_stream

from mlxd.model import ModelLoadError, load
from mlxd.model import peft as peft_module
from mlxd.model.peft import mlx_adapter

ARCH = "llama"  # two blocks: an adapter on the last one only skips one


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $MLXD_HOME: every test converts into its own cache."""
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def model_dir(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model(ARCH)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(model_dir)


def _adapted(model_dir: Path, adapter: str | Path) -> Any:
    model, _ = load_model(model_dir)
    return load_adapters(model, str(adapter)).eval()


def _generate(model: Any, tokenizer: Any, seed: int | None) -> Any:
    kw = {"sampler": mlx_lm.sample_utils.make_sampler(temp=0.8)} if seed is not None else {}
    prompt = tokenizer.encode(PROMPT_TEXT)[:10]
    return run_stream(mlx_lm.stream_generate, model, tokenizer, prompt, seed=seed,
                      max_tokens=6, **kw)  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "num_layers", "rslora"),
    [("lora", -1, False), ("dora", -1, False), ("lora", 1, False), ("lora", -1, True)],
    ids=["lora", "dora", "last-block-only", "rslora"],
)
def test_peft_equals_mlx_lm_format(
    model_dir: Path, tokenizer: Any, tmp_path: Path, kind: str, num_layers: int, rslora: bool
) -> None:
    mlx_dir = tiny_adapter_dir(model_dir, kind, num_layers=num_layers)
    # rsLoRA's scale is alpha / sqrt(r): the alpha that gives the same scale
    alpha = {"use_rslora": True, "lora_alpha": SCALE * math.sqrt(RANK)} if rslora else {}
    peft_dir = write_peft(mlx_dir, tmp_path / "peft", **alpha)
    converted = mlx_adapter(str(peft_dir), model_dir)
    assert converted != str(peft_dir)
    ref, got = _adapted(model_dir, mlx_dir), _adapted(model_dir, converted)
    assert_same_parameters(ref, got)
    for seed in (None, 3):
        want = _generate(ref, tokenizer, seed)
        assert want.error is None and len(want.tokens) == 6
        assert_same_run(want, _generate(got, tokenizer, seed), f"{kind} seed={seed}")


def test_load_takes_a_peft_folder(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """mlxd.load end to end (what generate and serve call), and the base model differs."""
    mlx_dir = tiny_adapter_dir(model_dir, "lora")
    peft_dir = write_peft(mlx_dir, tmp_path / "peft")
    model, tok = load(str(model_dir), adapter_path=str(peft_dir))
    want = _generate(_adapted(model_dir, mlx_dir), tokenizer, None)
    assert_same_run(want, _generate(model, tok, None))
    base, _ = load_model(model_dir)
    assert _generate(base, tokenizer, None).tokens != want.tokens


def test_converted_once_and_again_when_changed(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peft_dir = write_peft(tiny_adapter_dir(model_dir, "lora"), tmp_path / "peft")
    first = mlx_adapter(str(peft_dir), model_dir)

    def no(*args: Any) -> None:
        raise AssertionError("converted again")

    with monkeypatch.context() as m:
        m.setattr(peft_module, "_peft_weights", no)
        assert mlx_adapter(str(peft_dir), model_dir) == first
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    config["lora_alpha"] = 2 * config["lora_alpha"]
    (peft_dir / "adapter_config.json").write_text(json.dumps(config))
    second = mlx_adapter(str(peft_dir), model_dir)
    assert second != first
    scale = json.loads((Path(second) / "adapter_config.json").read_text())["lora_parameters"]
    assert scale["scale"] == 2 * SCALE


def _peft(tmp_path: Path, model_dir: Path, kind: str = "lora") -> Path:
    return write_peft(tiny_adapter_dir(model_dir, kind), tmp_path / "peft")


def _edit_config(folder: Path, **changes: Any) -> Path:
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder / "adapter_config.json"


def _edit_tensors(folder: Path, change: Callable[[dict], None]) -> Path:
    path = folder / "adapter_model.safetensors"
    tensors = dict(mx.load(str(path)))
    change(tensors)
    mx.save_safetensors(str(path), tensors)
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _head(path: Path) -> bytes:
    return path.read_bytes()[:-9]


FIRST_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
BREAKAGES: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "config not json": lambda f: (_write(f / "adapter_config.json", b"{r: 4"), "not valid JSON"),
    "config a list": lambda f: (_write(f / "adapter_config.json", b"[]"), "not a JSON object"),
    "weights junk": lambda f: (
        _write(f / "adapter_model.safetensors", b"not safetensors" * 4),
        "not a readable safetensors file",
    ),
    "weights truncated": lambda f: (
        _write(
            f / "adapter_model.safetensors", (f / "adapter_model.safetensors").read_bytes()[:-9]
        ),
        "not a readable safetensors file",
    ),
    "other peft type": lambda f: (_edit_config(f, peft_type="IA3"), "IA3"),
    "rank pattern": lambda f: (_edit_config(f, rank_pattern={"q_proj": 8}), "per-module ranks"),
    "r differs": lambda f: (
        _edit_config(f, r=8).with_name("adapter_model.safetensors"),
        "rank 4, but adapter_config.json says r = 8",
    ),
    "alpha missing": lambda f: (_edit_config(f, lora_alpha=None), "lora_alpha"),
    "unknown tensor": lambda f: (
        _edit_tensors(f, lambda t: t.update({"base_model.model.lm_head.weight": mx.ones((2, 2))})),
        "unexpected tensor base_model.model.lm_head.weight",
    ),
    "lora_B missing": lambda f: (
        _edit_tensors(f, lambda t: t.pop(FIRST_A.replace("lora_A", "lora_B"))),
        "has no lora_b",
    ),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_bad_peft_adapter_names_its_file(model_dir: Path, tmp_path: Path, breakage: str) -> None:
    folder = _peft(tmp_path, model_dir)
    path, why = BREAKAGES[breakage](folder)
    with pytest.raises(ModelLoadError) as e:
        load(str(model_dir), adapter_path=str(folder))
    message = str(e.value)
    assert "\n" not in message and str(path) in message and why in message, message


def test_a_magnitude_needs_use_dora(model_dir: Path, tmp_path: Path) -> None:
    folder = _peft(tmp_path, model_dir, "dora")
    path = _edit_config(folder, use_dora=False)
    with pytest.raises(ModelLoadError, match="use_dora is off") as e:
        load(str(model_dir), adapter_path=str(folder))
    assert str(path.with_name("adapter_model.safetensors")) in str(e.value)


def test_a_pickled_peft_adapter_is_refused(model_dir: Path, tmp_path: Path) -> None:
    folder = _peft(tmp_path, model_dir)
    (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    with pytest.raises(ModelLoadError, match="adapter_model.bin: pickled PEFT adapters"):
        load(str(model_dir), adapter_path=str(folder))


def _mlx_copy(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_adapter_dir(model_dir, "lora"), tmp_path / "mlx-adapter"))


def test_a_bad_mlx_lm_adapter_is_one_line(
    model_dir: Path, tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """mlx-lm's own format: a config without `scale` (a KeyError deep in mlx-lm otherwise), a
    missing weight file, and an adapter made for another model (mlx-lm's multi-line error)."""
    folder = _mlx_copy(model_dir, tmp_path)
    good = (folder / "adapter_config.json").read_text()
    config = json.loads(good)
    config["lora_parameters"] = {"rank": 4, "dropout": 0.0, "alpha": 8}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="scale, not alpha"):
        load(str(model_dir), adapter_path=str(folder))
    (folder / "adapter_config.json").write_text(good)
    (folder / "adapters.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="adapters.safetensors: not found"):
        load(str(model_dir), adapter_path=str(folder))
    other = tiny_adapter_dir(tiny_model("qwen3"), "lora")
    with pytest.raises(ModelLoadError, match="incompatible tensors") as e:
        load(str(model_dir), adapter_path=str(other))
    assert "\n" not in str(e.value)
