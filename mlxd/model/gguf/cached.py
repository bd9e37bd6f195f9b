"""The finished conversions under $MLXD_HOME/models, read from their markers (offline, and no
GGUF is opened): what `mlxd models` lists as converted."""

import json
from dataclasses import dataclass
from pathlib import Path

from .convert import CONVERTER_VERSION, MARKER


@dataclass(frozen=True)
class Conversion:
    folder: Path
    source: Path  # the GGUF it was converted from (it may since have moved or gone)
    sha256: str
    dtype: str
    architecture: str


def conversions(home: Path) -> list[Conversion]:
    """Complete conversions of the current converter version, by folder name."""
    found = []
    for marker_path in sorted((home / "models").glob(f"*/{MARKER}")):
        folder = marker_path.parent
        try:
            marker = json.loads(marker_path.read_text())
            if marker["converter_version"] != CONVERTER_VERSION:
                continue  # converted again on its next use, so not ready now
            if folder.name.startswith(".") or not (folder / "config.json").is_file():
                continue  # a temp folder mid-publish, or a damaged one
            found.append(
                Conversion(
                    folder,
                    Path(marker["source"]),
                    str(marker["source_sha256"]),
                    str(marker["dtype"]),
                    str(marker["architecture"]),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable marker: the loader would not trust it either
    return found
