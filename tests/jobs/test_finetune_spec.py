"""FineTuneSpec.from_dict validates every field; a malformed training file names its line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from mlxd.jobs.finetune import FineTuneSpec, run_finetune
from mlxd.jobs.finetune_data import read_jsonl
from mlxd.jobs.report import JobError, Reporter

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


@pytest.fixture(scope="module")
def model_dir(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("qwen3")


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(CHAT) + "\n")
    return path


def test_defaults_and_auto(model_dir: Path, train_file: Path) -> None:
    spec = FineTuneSpec.from_dict({"model": str(model_dir), "train_file": str(train_file)})
    assert (spec.fine_tune_type, spec.rank, spec.scale, spec.dropout) == ("lora", 8, 20.0, 0.0)
    assert (spec.num_layers, spec.max_seq_length, spec.mask_prompt) == (16, 2048, True)
    assert (spec.steps_per_report, spec.steps_per_eval, spec.save_every) == (1, 50, 100)
    assert spec.resolved_learning_rate() == 1e-5
    # OpenAI's auto epochs: 3, raised for tiny files (>= 100 examples seen), lowered for huge ones
    assert [spec.resolved_epochs(n) for n in (1, 10, 40, 1000, 100_000)] == [25, 10, 3, 3, 1]
    assert [spec.resolved_batch_size(n) for n in (1, 3, 100)] == [1, 3, 4]
    assert spec.resolved_iters(10) == 10 * (10 // 4)  # epochs x full batches
    given = {"n_epochs": 2, "batch_size": 5, "learning_rate_multiplier": 3.0}
    spec = FineTuneSpec.from_dict({"model": str(model_dir), "train_file": str(train_file), **given})
    assert spec.resolved_iters(12) == 2 * 2 and spec.resolved_learning_rate() == 1e-5 * 3.0
    spec = FineTuneSpec.from_dict(
        {"model": str(model_dir), "train_file": str(train_file), "iters": 7, "learning_rate": 0.5}
    )
    assert spec.resolved_iters(1000) == 7 and spec.resolved_learning_rate() == 0.5


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("n_epochs", 0),
        ("n_epochs", "many"),
        ("n_epochs", True),
        ("batch_size", 2.5),
        ("learning_rate_multiplier", 0),
        ("learning_rate_multiplier", float("nan")),
        ("learning_rate", -1.0),
        ("iters", 0),
        ("fine_tune_type", "full"),
        ("rank", 0),
        ("dropout", 1.0),
        ("num_layers", -2),
        ("max_seq_length", 1),
        ("mask_prompt", "yes"),
        ("seed", -1),
        ("save_every", 0),
        ("valid_file", "/nonexistent/valid.jsonl"),
        ("resume_adapter_file", "/nonexistent/a.safetensors"),
        ("model", "/nonexistent/model"),
        ("train_file", 3),
        ("hyperparameters", {}),
    ],
)
def test_from_dict_rejects(model_dir: Path, train_file: Path, key: str, value: object) -> None:
    d = {"model": str(model_dir), "train_file": str(train_file), key: value}
    with pytest.raises(ValueError, match=rf"^{key}: "):
        FineTuneSpec.from_dict(d)


def test_from_dict_requires_model_and_file(model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"^train_file: required"):
        FineTuneSpec.from_dict({"model": str(model_dir)})
    with pytest.raises(ValueError, match=r"^model: required"):
        FineTuneSpec.from_dict({"train_file": "x"})


@pytest.mark.parametrize(
    ("lines", "line", "why"),
    [
        ([CHAT, "{not json"], 2, "not valid JSON"),
        ([CHAT, [1, 2]], 2, "not a JSON object"),
        ([CHAT, CHAT, {"question": "?"}], 3, "has none of"),
        ([CHAT, {"text": "plain"}], 2, "text format, but earlier lines are chat format"),
        ([{"prompt": "a", "completion": "b"}, CHAT], 2, "chat format, but earlier"),
        ([{"messages": []}], 1, "non-empty list"),
        ([{"messages": [{"content": "no role"}]}], 1, "must be an object with a"),
        ([{"prompt": "a", "completion": 5}], 1, '"completion" must be a string'),
    ],
)
def test_invalid_file_names_the_line(tmp_path: Path, lines: list, line: int, why: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    with pytest.raises(JobError) as e:
        read_jsonl(str(path), "train_file")
    assert e.value.code == "invalid_file"
    assert e.value.message.startswith(f"train_file line {line}: ")
    assert why in e.value.message


def test_blank_lines_are_skipped_and_empty_file_fails(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + json.dumps(CHAT) + "\n\n" + json.dumps(CHAT) + "\n")
    rows, lines, kind = read_jsonl(str(path), "train_file")
    assert (len(rows), lines, kind) == (2, [2, 4], "chat")
    path.write_text("\n \n")
    with pytest.raises(JobError, match="no examples"):
        read_jsonl(str(path), "valid_file")


def test_run_finetune_reports_bad_line(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([json.dumps(CHAT)] * 6 + ['{"messages": [}']) + "\n")
    spec = FineTuneSpec.from_dict({"model": str(model_dir), "train_file": str(path)})
    with pytest.raises(JobError) as e:
        run_finetune(spec, tmp_path / "out", Reporter.collect())
    assert e.value.code == "invalid_file"
    assert e.value.message.startswith("train_file line 7: not valid JSON")


def test_too_few_examples_for_the_batch(model_dir: Path, train_file: Path, tmp_path: Path) -> None:
    spec = FineTuneSpec.from_dict(
        {"model": str(model_dir), "train_file": str(train_file), "batch_size": 2}
    )
    with pytest.raises(JobError, match="train_file: 1 examples, fewer than batch_size 2"):
        run_finetune(spec, tmp_path, Reporter.collect())
