"""What `mlxd chat` prints: a header, the prompt, each reply streamed with its reasoning dimmed
on a terminal (plain text elsewhere), and mlx_lm.chat's stats line after it."""

import sys
from typing import Any, TextIO

DIM, UNDIM = "\x1b[2m", "\x1b[22m"
THINK = ("<think>", "</think>")


def think_markers(tokenizer: Any) -> tuple[str, str]:
    """The tokenizer's reasoning markers (mlx-lm infers them from its vocabulary), else
    <think>...</think>."""
    if getattr(tokenizer, "has_thinking", False):
        return tokenizer.think_start, tokenizer.think_end
    return THINK


class Reply:
    """One streamed reply. Off a terminal the text is written as it comes, byte for byte; on
    one, the span from the start marker through the end marker is dimmed. A marker split
    across two segments is held back until it is whole."""

    def __init__(self, out: TextIO, dim: bool, markers: tuple[str, str], thinking: bool) -> None:
        self.out, self.dim, self.markers = out, dim, markers
        self.thinking = thinking
        self.pending = ""
        if dim and thinking:  # the prompt already opened the reasoning
            out.write(DIM)

    def write(self, text: str) -> None:
        if not self.dim:
            self.out.write(text)
            self.out.flush()
            return
        self.pending += text
        while True:
            marker = self.markers[1] if self.thinking else self.markers[0]
            i = self.pending.find(marker)
            if i < 0:
                break
            head, self.pending = self.pending[:i], self.pending[i + len(marker) :]
            if self.thinking:
                self.out.write(head + marker + UNDIM)
            else:
                self.out.write(head + DIM + marker)
            self.thinking = not self.thinking
        keep = _partial(self.pending, marker)
        self.out.write(self.pending[: len(self.pending) - keep])
        self.pending = self.pending[len(self.pending) - keep :]
        self.out.flush()

    def close(self) -> None:
        self.out.write(self.pending + (UNDIM if self.dim and self.thinking else "") + "\n")
        self.pending = ""
        self.out.flush()


def _partial(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ChatScreen:
    """The terminal side of a chat: mlx_lm.chat's keys (q, r, h) and lines, without its
    boxes, so that piped output stays plain text."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty()

    def muted(self, text: str) -> str:
        return f"{DIM}{text}{UNDIM}" if self.tty else text

    def header(self, rows: list[tuple[str, str]]) -> None:
        width = max(len(k) for k, _ in rows)
        print("mlxd chat", file=self.out)
        for k, v in rows:
            print(f"  {k.ljust(width)}   {v}", file=self.out)
        self.help()

    def help(self) -> None:
        keys = f"q {self.muted('exit')}   r {self.muted('reset')}   h {self.muted('help')}"
        print(f"  commands    {keys}", file=self.out)

    def prompt(self) -> str | None:
        """The next line typed, or None at the end of the input."""
        try:
            line = input("> ")
        except EOFError:
            return None
        if not sys.stdin.isatty():  # nothing echoed the newline: end the prompt's line
            self.out.write("\n")
        return line

    def reply(self, markers: tuple[str, str], thinking: bool = False) -> Reply:
        return Reply(self.out, self.tty, markers, thinking)

    def stats(self, line: str) -> None:
        print(f"  {self.muted(line)}", file=self.out, flush=True)

    def say(self, line: str) -> None:
        print(self.muted(line), file=self.out, flush=True)


def local_stats(response: Any) -> str:
    """mlx_lm.chat's line after a reply, from the last GenerationResponse."""
    return (
        f"{response.generation_tokens} tokens · {response.generation_tps:.1f} tok/s · "
        f"prompt {response.prompt_tps:.1f} tok/s · peak {response.peak_memory:.2f} GB"
    )
