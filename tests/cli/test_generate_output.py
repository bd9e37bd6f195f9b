"""`mlxd generate` prints what `mlx_lm.generate` prints, token for token, on the same model."""

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPORT = [
    r"==========",
    r"==========",
    r"Prompt: \d+ tokens, [\d.]+ tokens-per-sec",
    r"Generation: \d+ tokens, [\d.]+ tokens-per-sec",
    r"Peak memory: [\d.]+ GB",
]


def _run(module: str, model: Path, *extra: str) -> str:
    args = ["generate", "--model", str(model), "--prompt", "Write a haiku", "--max-tokens", "12"]
    r = subprocess.run(
        [sys.executable, "-m", module, *args, *extra], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _split(out: str) -> tuple[str, list[str]]:
    """(generated text, the report lines) of mlx-lm's verbose format."""
    first = out.index("==========\n") + len("==========\n")
    second = out.index("\n==========\n", first)
    text = out[first:second]
    frame = ["==========", "=========="] + out[second + 12 :].strip().splitlines()
    return text, frame


@pytest.mark.parametrize(
    "extra",
    [(), ("--temp", "0.8", "--seed", "7", "--top-k", "20")],
    ids=["greedy", "seeded"],
)
def test_same_text_and_report_format(tiny_model: Callable[..., Path], extra: tuple) -> None:
    model = tiny_model("qwen3")
    ours, theirs = _split(_run("mlxd", model, *extra)), _split(_run("mlx_lm", model, *extra))
    assert ours[0] == theirs[0] and ours[0]
    for pattern, line in zip(REPORT, ours[1], strict=True):
        assert re.fullmatch(pattern, line), line
    # The token counts are exact; only the rates and memory may differ between runs.
    assert ours[1][2].split(",")[0] == theirs[1][2].split(",")[0]
    assert ours[1][3].split(",")[0] == theirs[1][3].split(",")[0]


def test_quiet_prints_only_the_text(tiny_model: Callable[..., Path]) -> None:
    model = tiny_model("llama")
    ours = _run("mlxd", model, "--verbose", "False")
    theirs = _run("mlx_lm", model, "--verbose", "False")
    assert ours == theirs and "==========" not in ours
