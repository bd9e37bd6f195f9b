"""The `edit` workload of `mlxd bench serve`: each agent sends a real Python source file (a
module of the running Python's standard library, picked by a seeded RNG and cut to a token
budget under the model's tokenizer) and asks for the whole file back with one small change.
The reply mostly copies the prompt: the case n-gram prompt lookup drafts from."""

import random
import re
import sysconfig
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any

from .fleet import Workload

SYSTEM = (
    "You are a coding agent. When asked to change a file, reply with the complete updated "
    "file in one ```python block and nothing else."
)
DEF = re.compile(r"^[ \t]*def ([A-Za-z_][A-Za-z0-9_]*)\(", re.MULTILINE)


def source_files(root: Path | None = None, min_chars: int = 20_000) -> list[Path]:
    """The standard library's top-level modules of at least `min_chars`, sorted by name (the
    generated sysconfig data left out): the same list for one Python version everywhere."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        p
        for p in root.glob("*.py")
        if not p.name.startswith("_sysconfigdata") and p.stat().st_size >= min_chars
    )


def count(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def cut(tokenizer: Any, lines: list[str], budget: int) -> str:
    """The most leading whole lines within `budget` tokens, ended at the last top-level
    statement if that keeps three quarters of them (a file does not stop mid-function). Lines
    past 6 characters a token are never tokenized (code runs ~3-4): a whole module may not fit
    the model's context."""
    lo, hi = 0, bisect_right(list(accumulate(map(len, lines))), 6 * budget)
    while lo < hi:  # the largest k whose first k lines fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(tokenizer, "".join(lines[:mid])) <= budget else (lo, mid - 1)
    k = lo
    tops = [i for i in range(1, k) if lines[i][:1] not in ("", " ", "\t", "\n", ")", "]", "}")]
    if tops and count(tokenizer, "".join(lines[: tops[-1]])) >= 0.75 * budget:
        k = tops[-1]
    return "".join(lines[:k]).rstrip() + "\n"


def excerpt(tokenizer: Any, rng: random.Random, path: Path, budget: int) -> tuple[str, int]:
    """`path` from a top-level def or class in its first half (its start if it has none), cut
    to `budget` tokens: the excerpt defines a function to change; returns the text and its
    first line's index."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(("def ", "class "))]
    start = rng.choice(starts[: max(1, len(starts) // 2)] or [0])
    return cut(tokenizer, lines[start:], budget), start


def change(rng: random.Random, names: list[str]) -> str:
    """One small edit of a function the excerpt defines: a rename (not of a dunder method,
    which Python calls by its name) or a docstring."""
    if not names:  # an excerpt with no def (rare): the module gets the docstring
        return "add a one-line module docstring at the top"
    name = rng.choice(names)
    if rng.random() < 0.5 and not (name.startswith("__") and name.endswith("__")):
        return f"rename the function `{name}` to `{name}_v2` and update every use of it"
    return f"add a one-line docstring to the function `{name}`"


def functions(code: str) -> list[str]:
    """Functions and methods defined in `code`, each once, in order."""
    return list(dict.fromkeys(DEF.findall(code)))


def build_edit_workload(
    tokenizer: Any,
    agents: int,
    turns: int,
    file_tokens: int,
    seed: str,
    temperature: float = 0.0,
    top_p: float = 1.0,
    pool: list[Path] | None = None,
) -> Workload:
    """Agent i edits its own file (distinct files while the pool lasts): turn 1 sends it with
    one change, each later turn asks for one more. A reply may run to 5/4 of the file plus 64
    tokens, and ends at EOS: no token is banned."""
    rng = random.Random(seed)
    pool = pool if pool is not None else source_files(min_chars=5 * file_tokens)
    if not pool:
        raise ValueError(f"no source file of {5 * file_tokens}+ characters to cut")
    picks = rng.sample(pool, agents) if agents <= len(pool) else rng.choices(pool, k=agents)
    tasks, followups, lengths, sources = [], [], [], []
    for path in picks:
        code, start = excerpt(tokenizer, rng, path, file_tokens)
        edits = [change(rng, functions(code)) for _ in range(turns)]
        tasks.append(
            f"Here is the file `{path.name}`:\n\n```python\n{code}```\n\nPlease {edits[0]}. "
            "Reply with the whole updated file."
        )
        followups.append([f"Now also {e}. Reply with the whole file again." for e in edits[1:]])
        tokens = count(tokenizer, code)
        lengths.append([tokens * 5 // 4 + 64] * turns)
        sources.append({"file": path.name, "line": start + 1, "tokens": tokens, "edits": edits})
    return Workload(
        agents,
        turns,
        max(max(x) for x in lengths),
        SYSTEM,
        tasks,
        followups,
        [],
        temperature,
        top_p,
        lengths,
        kind="edit",
        sources=sources,
    )
