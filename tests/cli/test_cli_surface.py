"""`mlxd generate` takes every mlx_lm.generate flag with the same default; help groups by layer."""

import argparse
import subprocess
import sys
from pathlib import Path

from mlx_lm.generate import setup_arg_parser

from mlxd.cli import build_parser
from mlxd.cli.generate import configure


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def test_every_mlx_lm_generate_flag_with_its_default() -> None:
    theirs = _actions(setup_arg_parser())
    ours = _actions(configure(argparse.ArgumentParser()))
    assert set(theirs) <= set(ours), f"missing: {sorted(set(theirs) - set(ours))}"
    for dest, a in theirs.items():
        b = ours[dest]
        assert set(a.option_strings) <= set(b.option_strings), dest
        assert (a.default, a.type, a.nargs, type(a)) == (b.default, b.type, b.nargs, type(b)), dest


def test_help_lists_subcommands_and_groups_flags_by_layer() -> None:
    top = build_parser().format_help()
    for sub in ("generate", "convert"):
        assert sub in top
    sub_help = configure(argparse.ArgumentParser()).format_help()
    for title in ("model (L1)", "KV cache (L2)", "engine: sampling and limits (L3)", "(L4)"):
        assert title in sub_help


def _mlxd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mlxd", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_bad_model_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    r = _mlxd("generate", "--model", str(tmp_path / "missing-model"), cwd=tmp_path)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "missing-model" in lines[0] and "no such file" in lines[0]


def test_unsupported_model_type_from_cli(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "frobnicator"}')
    r = _mlxd("generate", "--model", str(tmp_path / "m"), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "unsupported model_type 'frobnicator'" in r.stderr


def test_no_subcommand_prints_help() -> None:
    r = subprocess.run([sys.executable, "-m", "mlxd"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "generate" in r.stdout
