"""`mlxd generate --draft-model` prints what `mlx_lm.generate --draft-model` prints."""

from collections.abc import Callable
from pathlib import Path

import pytest
from test_generate_output import _run, _split


@pytest.mark.parametrize(
    "extra",
    [("--num-draft-tokens", "2"), ("--temp", "0.8", "--seed", "7")],
    ids=["greedy", "seeded"],
)
def test_same_text_with_a_draft_model(tiny_model: Callable[..., Path], extra: tuple) -> None:
    model, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    flags = ("--draft-model", str(draft), *extra)
    ours, theirs = _split(_run("mlxd", model, *flags)), _split(_run("mlx_lm", model, *flags))
    assert ours[0] == theirs[0] and ours[0]
    assert ours[1][3].split(",")[0] == theirs[1][3].split(",")[0]  # the token count
