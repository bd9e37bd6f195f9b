"""The servers one `mlxd bench serve` run compares ("sides"): mlx_lm.server, mlxd, and mlxd
variants, each an mlxd server with extra flags of its own (`--mlxd-variant NAME=FLAGS`, e.g.
spec="--speculative ngram"), as side "mlxd-NAME"; with --adapters, "mlxd-base" (lora.py)."""

import argparse
import re
import shlex
from typing import Any

from .lora import BASE_SIDE, lora_flags

SIDES = ("mlx_lm", "mlxd")
LABEL = {"mlx_lm": "mlx-lm", "mlxd": "mlxd"}
NAME = re.compile(r"[A-Za-z0-9_]+")


def kind(side: str) -> str:
    """The server a side runs: "mlxd" for mlxd and its variants, else "mlx_lm"."""
    return "mlxd" if side == "mlxd" or side.startswith("mlxd-") else "mlx_lm"


def label(side: str) -> str:
    return LABEL.get(side, side)


def parse_variant(text: str) -> tuple[str, str]:
    """`NAME=FLAGS` (argparse type of --mlxd-variant): a word, then mlxd serve flags."""
    name, sep, flags = text.partition("=")
    if not sep or not NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"not NAME=FLAGS with NAME a word: {text!r} (e.g. spec='--speculative ngram')"
        )
    try:
        shlex.split(flags)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--mlxd-variant {name}: {e}") from None
    return name, flags


def variant_sides(args: Any) -> dict[str, str]:
    """Each `--mlxd-variant NAME=FLAGS` as its side "mlxd-NAME" and its extra flags; first,
    with --adapters, the base side (no flags of its own, no adapter)."""
    base = {BASE_SIDE: ""} if getattr(args, "adapters", None) else {}
    named = getattr(args, "mlxd_variant", None) or []
    return base | {f"mlxd-{name}": flags for name, flags in named}


def run_sides(args: Any) -> list[str]:
    """The sides a run starts, in order: mlx-lm, mlxd, the variants; --only mlxd keeps every
    mlxd side, --only mlx-lm the one mlx_lm.server."""
    sides = [*SIDES, *variant_sides(args)]
    only = getattr(args, "only", None)
    return [s for s in sides if only is None or label(kind(s)) == only]


def server_flags(args: Any, side: str) -> list[str]:
    """A side's extra server flags: the adapters' first, a variant's after --mlxd-args, so
    that the later win."""
    if kind(side) == "mlx_lm":
        return shlex.split(args.mlx_lm_args)
    mine = shlex.split(variant_sides(args).get(side, ""))
    return lora_flags(args, side) + shlex.split(args.mlxd_args) + mine


def ratio_pairs(sides: list[str]) -> list[tuple[str, str]]:
    """The (numerator, denominator) sides compared: mlxd over mlx-lm, and each mlxd variant
    over mlx-lm and over plain mlxd, where both ran; plain mlxd (with adapters) over the base
    side (without)."""
    variants = [v for v in sides if v.startswith("mlxd-") and v != BASE_SIDE]
    want = [("mlxd", "mlx_lm"), ("mlxd", BASE_SIDE)] + [(v, b) for v in variants for b in SIDES]
    return [(a, b) for a, b in want if a in sides and b in sides]
