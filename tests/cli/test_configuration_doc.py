"""docs/configuration.md is generated from mlxd/config.py's dataclasses (`mlxd config`): the
checked-in file must be the generated text, so a setting cannot change without its docs."""

from pathlib import Path

from mlxd.cli import main
from mlxd.config import ServeConfig, markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_checked_in_doc_is_the_generated_one() -> None:
    assert DOC.read_text() == markdown(), "run `mlxd config > docs/configuration.md`"


def test_mlxd_config_prints_it(capsys) -> None:
    main(["config"])
    assert capsys.readouterr().out == markdown()


def test_every_serve_flag_has_a_row_with_its_help() -> None:
    text = markdown()
    for f in ServeConfig.__dataclass_fields__.values():
        if "flags" in f.metadata:
            assert f"| `{f.metadata['flags'][0]}`" in text, f.name
            assert f.metadata["help"].replace("|", "\\|") in text, f.name
