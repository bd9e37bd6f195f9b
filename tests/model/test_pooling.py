"""A sentence-transformers folder's Pooling module picks the pooling; anything else is mean."""

import json
from pathlib import Path

import pytest

from mlxd.model.pooling import pooling_of

ST = "sentence_transformers.models."


def folder(tmp_path: Path, modules: object, config: object = None) -> Path:
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if config is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return tmp_path


MODULES = [{"idx": 0, "path": "", "type": ST + "Transformer"},
           {"idx": 1, "path": "1_Pooling", "type": ST + "Pooling"},
           {"idx": 2, "path": "2_Normalize", "type": ST + "Normalize"}]  # fmt: skip


@pytest.mark.parametrize(
    "config, want",
    [
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
        ({"pooling_mode_lasttoken": True}, "last"),
        ({"pooling_mode_mean_tokens": True}, "mean"),
        ({"pooling_mode_max_tokens": True}, "mean"),  # not run here: the default
        ([], "mean"),
    ],
)
def test_the_pooling_config_names_the_mode(tmp_path: Path, config, want) -> None:
    assert pooling_of(folder(tmp_path, MODULES, config)) == want


def test_no_or_broken_config_means_mean(tmp_path: Path) -> None:
    assert pooling_of(None) == "mean"
    assert pooling_of(tmp_path) == "mean"  # a causal LM's folder
    assert pooling_of(folder(tmp_path, MODULES)) == "mean"  # the module's config is missing
    (tmp_path / "modules.json").write_text("{not json")
    assert pooling_of(tmp_path) == "mean"
