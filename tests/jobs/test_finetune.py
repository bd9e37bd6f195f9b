"""The fine-tuning driver on a tiny random Qwen3: it learns, it stops within one step keeping its
work, it survives a batch with no targets, it refuses a NaN adapter, and its adapter generates the
same tokens in mlx-lm and mlxd."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.trainer import default_loss, iterate_batches
from mlx_lm.tuner.utils import load_adapters
from mlx_lm.utils import load_model, load_tokenizer
from parity.helpers import assert_same_run, run_stream

import mlxd
from mlxd.jobs.finetune import FineTuneSpec, run_finetune
from mlxd.jobs.finetune_data import load_examples
from mlxd.jobs.finetune_guards import guarded_loss, target_count
from mlxd.jobs.report import Collected, JobError, Reporter


def _chat(i: int) -> dict:
    q = {"role": "user", "content": f"Colour {i}?"}
    return {"messages": [q, {"role": "assistant", "content": "Blue."}]}


@pytest.fixture(scope="module")
def model_dir(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("qwen3")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("data")
    files = {"train": d / "train.jsonl", "valid": d / "valid.jsonl"}
    files["train"].write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(8)))
    files["valid"].write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(8, 10)))
    return files


def _spec(model_dir: Path, train: Path, **kw: Any) -> FineTuneSpec:
    base = {"model": str(model_dir), "train_file": str(train), "batch_size": 2}
    return FineTuneSpec.from_dict({**base, "learning_rate": 1e-3, **kw})


def _of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


@pytest.fixture(scope="module")
def trained(model_dir: Path, data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("job")
    spec = _spec(model_dir, data["train"], valid_file=str(data["valid"]), iters=6, save_every=3,
                 steps_per_eval=3, val_batches=1)  # fmt: skip
    report = Reporter.collect()
    return run_finetune(spec, out, report), report.events


def test_training_lowers_the_loss(trained: tuple[dict, list[dict]]) -> None:
    result, events = trained
    losses = [e["data"]["train_loss"] for e in _of(events, "metrics") if "train_loss" in e["data"]]
    assert len(losses) == 6 and result["steps"] == 6 and not result["stopped"]
    assert losses[-1] < losses[0] / 4, losses
    assert result["train_loss"] == losses[-1]
    # trained_tokens counted from the batches == the trainer's own count of loss targets
    last = [e["data"] for e in _of(events, "metrics") if "trained_tokens" in e["data"]][-1]
    assert result["trained_tokens"] == last["trained_tokens"] > 0
    valid = [e["data"] for e in _of(events, "metrics") if "valid_loss" in e["data"]]
    assert [v["step"] for v in valid] == [0, 2, 5]  # mlx-lm validates before steps 1, 3 and 6
    assert result["valid_loss"] == valid[-1]["valid_loss"]
    progress = [e["progress"] for e in _of(events, "progress") if not e["stage"]]
    assert progress == [k / 6 for k in range(1, 7)]
    checkpoints = _of(events, "checkpoint")
    assert [c["step"] for c in checkpoints] == [3, 6]
    for c in checkpoints:
        assert Path(c["path"]).is_file() and c["metrics"]["train_loss"] == losses[c["step"] - 1]


def test_adapter_generates_the_same_tokens_in_mlx_lm_and_mlxd(
    model_dir: Path, trained: tuple[dict, list[dict]]
) -> None:
    adapter = trained[0]["adapter_path"]
    ref_model, ref_tok = mlx_lm.load(str(model_dir), adapter_path=adapter)
    got_model, got_tok = mlxd.load(str(model_dir), adapter_path=adapter)
    base_model, _ = mlx_lm.load(str(model_dir))
    prompt = ref_tok.apply_chat_template(
        [{"role": "user", "content": "Colour 3?"}], add_generation_prompt=True
    )
    ref = run_stream(mlx_lm.stream_generate, ref_model, ref_tok, prompt, seed=None, max_tokens=8)
    got = run_stream(mlxd.stream_generate, got_model, got_tok, prompt, seed=None, max_tokens=8)
    assert ref.error is None and len(ref.tokens) > 0
    assert_same_run(ref, got)
    base = run_stream(mlx_lm.stream_generate, base_model, ref_tok, prompt, seed=None, max_tokens=8)
    assert base.tokens != ref.tokens  # the adapter is really in use


class _StopAfter(Collected):
    """Asks for a stop from the progress event of step `k`, as a cancel arriving then would."""

    def __init__(self, k: int, total: int) -> None:
        super().__init__()
        self.k, self.total = k, total

    def progress(self, fraction: float, stage: str = "", eta_s: float | None = None) -> None:
        super().progress(fraction, stage, eta_s)
        if not stage and fraction >= self.k / self.total:
            self.stop()


def test_stop_ends_within_one_step_and_keeps_the_adapter(
    model_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    spec = _spec(model_dir, data["train"], iters=20, save_every=1)
    report = _StopAfter(2, 20)
    result = run_finetune(spec, tmp_path, report)
    assert result["stopped"] is True and result["steps"] == 2
    folder = Path(result["adapter_path"])
    saved = sorted(p.name for p in folder.glob("*_adapters.safetensors"))
    assert saved == ["0000001_adapters.safetensors", "0000002_adapters.safetensors"]
    final = mx.load(str(folder / "adapters.safetensors"))
    at_step = mx.load(str(folder / "0000002_adapters.safetensors"))
    assert sorted(final) == sorted(at_step)
    for name, w in final.items():
        assert mx.array_equal(w, at_step[name]), name
    model, _ = load_model(model_dir)
    params = dict(tree_flatten(load_adapters(model, str(folder)).parameters()))
    for name, w in final.items():
        assert mx.array_equal(params[name], w), name
    assert any(float(mx.abs(w).max()) > 0 for n, w in final.items() if n.endswith("lora_b"))


def _zero_target_file(tmp_path: Path) -> Path:
    long = "Describe, in as many careful words as you can manage, the colour of the sea at dawn."
    rows = [{"prompt": f"{long} ({i})", "completion": "Grey."} for i in range(4)]
    path = tmp_path / "masked.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_batch_without_targets_is_not_nan(model_dir: Path, tmp_path: Path) -> None:
    path = _zero_target_file(tmp_path)
    tokenizer = load_tokenizer(model_dir)
    dataset = load_examples(str(path), "train_file", tokenizer, mask_prompt=True)
    assert min(dataset[i][1] for i in range(len(dataset))) > 12  # every prompt is > 12 tokens
    batch = next(iterate_batches(dataset, batch_size=2, max_seq_length=12))
    assert target_count(*batch) == 0
    model, _ = load_model(model_dir)
    stock, n = default_loss(model, *batch)
    assert n.item() == 0 and mx.isnan(stock).item()  # mlx-lm's loss: 0 / 0
    guarded, n = guarded_loss(model, *batch)
    assert n.item() == 0 and guarded.item() == 0.0
    # and a whole job on such batches ends with a finite (unchanged) adapter
    spec = _spec(model_dir, path, iters=2, max_seq_length=12, learning_rate=0.1)
    result = run_finetune(spec, tmp_path / "job", Reporter.collect())
    assert result["steps"] == 2 and result["train_loss"] == 0.0 and result["trained_tokens"] == 0


def test_guarded_loss_equals_default_loss_bit_for_bit(
    model_dir: Path, data: dict[str, Path]
) -> None:
    tokenizer = load_tokenizer(model_dir)
    dataset = load_examples(str(data["train"]), "train_file", tokenizer, mask_prompt=True)
    model, _ = load_model(model_dir)
    batch = next(iterate_batches(dataset, batch_size=4, max_seq_length=2048))
    want, want_n = default_loss(model, *batch)
    got, got_n = guarded_loss(model, *batch)
    assert want_n.item() == target_count(*batch) > 0
    assert mx.array_equal(got_n, want_n) and mx.array_equal(got, want)
    assert got.dtype == want.dtype and mx.isfinite(got).item()


def test_a_diverging_run_fails_with_nonfinite_adapter(
    model_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    spec = _spec(model_dir, data["train"], iters=10, learning_rate=1e30)
    report = Reporter.collect()
    with pytest.raises(JobError) as e:
        run_finetune(spec, tmp_path, report)
    assert e.value.code == "nonfinite_adapter"
    weights = mx.load(str(tmp_path / "adapter" / "adapters.safetensors"))
    assert not all(mx.all(mx.isfinite(w)).item() for w in weights.values())
    steps = [e["data"]["step"] for e in _of(report.events, "metrics")]
    assert steps[-1] < 10  # a NaN loss ends the run early instead of training on


def test_resume_starts_from_the_given_adapter(
    model_dir: Path, data: dict[str, Path], trained: tuple[dict, list[dict]], tmp_path: Path
) -> None:
    result, events = trained
    first = [e["data"]["train_loss"] for e in _of(events, "metrics") if "train_loss" in e["data"]]
    resume = str(Path(result["adapter_path"]) / "adapters.safetensors")
    spec = _spec(model_dir, data["train"], iters=1, resume_adapter_file=resume)
    again = run_finetune(spec, tmp_path, Reporter.collect())
    # step 1's loss is measured before its update: on the trained weights, not fresh ones
    assert again["train_loss"] < first[0] / 4, (again["train_loss"], first)
