"""`mlxd chat` prints mlx_lm.chat's replies for the same typed lines, takes its flags with their
defaults, dims reasoning on a terminal only, and with --url chats with a live server."""

import argparse
import io
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from mlx_lm.chat import setup_arg_parser

from mlxd.cli import main
from mlxd.cli.chat import configure
from mlxd.cli.chat_ui import DIM, UNDIM, Reply

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x01\x02]")
STATS = re.compile(r"(.*)\n  \d+ tokens · ", re.DOTALL)


def replies(out: str, prompt: str) -> list[str]:
    """The text streamed after each prompt that ended in a reply (its stats line follows)."""
    found = [STATS.match(part) for part in ANSI.sub("", out).split(prompt)[1:]]
    return [m.group(1) for m in found if m is not None]


def _chat(module: str, model: Path, lines: str, *extra: str) -> str:
    cmd = [sys.executable, "-m", module, "chat", "--model", str(model), *extra]
    r = subprocess.run(cmd, input=lines, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(
    "lines,extra",
    [
        ("hello\nr\nanother\nq\n", ("--max-tokens", "24")),
        # No reset: the second turn runs on the cache the first one left (the kept history).
        ("hello\nh\nand then?\nq\n", ("-m", "16", "--system-prompt", "Be brief.")),
        ("hi\nmore\nq\n", ("-m", "16", "--temp", "0.8", "--seed", "7", "--top-p", "0.9")),
    ],
    ids=["reset", "kept-cache", "seeded"],
)
def test_same_replies_as_mlx_lm_chat(
    tiny_model: Callable[..., Path], lines: str, extra: tuple[str, ...]
) -> None:
    model = tiny_model("qwen3")
    theirs = replies(_chat("mlx_lm", model, lines, *extra), "› \n")
    ours = replies(_chat("mlxd", model, lines, *extra), "> \n")
    assert len(theirs) == 2 and all(theirs)
    assert ours == theirs


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def test_every_mlx_lm_chat_flag_with_its_default() -> None:
    theirs, ours = _actions(setup_arg_parser()), _actions(configure(argparse.ArgumentParser()))
    assert set(theirs) <= set(ours), f"missing: {sorted(set(theirs) - set(ours))}"
    for dest, a in theirs.items():
        b = ours[dest]
        assert set(a.option_strings) <= set(b.option_strings), dest
        if dest != "model":  # ours: the embedded default model, as `mlxd generate`
            assert a.default == b.default, dest
        assert (a.type, a.nargs, type(a)) == (b.type, b.nargs, type(b)), dest


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
def test_reasoning_is_dimmed_on_a_terminal_only(tty: bool) -> None:
    out = io.StringIO()
    reply = Reply(out, tty, ("<think>", "</think>"), thinking=False)
    for segment in ["Hm <th", "ink>", "\nadd them\n</", "think>", "\n\nFour <", "b>."]:
        reply.write(segment)
    reply.close()
    plain = "Hm <think>\nadd them\n</think>\n\nFour <b>.\n"
    if tty:
        assert out.getvalue() == f"Hm {DIM}<think>\nadd them\n</think>{UNDIM}\n\nFour <b>.\n"
    else:
        assert out.getvalue() == plain


def test_reasoning_opened_by_the_prompt_is_dimmed_from_the_start() -> None:
    out = io.StringIO()
    reply = Reply(out, True, ("<think>", "</think>"), thinking=True)
    reply.write("plan</think>answer")
    reply.close()
    assert out.getvalue() == f"{DIM}plan</think>{UNDIM}answer\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _chat_in_process(
    monkeypatch: pytest.MonkeyPatch, lines: str, *argv: str, tty: bool = False
) -> tuple[str, str]:
    """Run `mlxd chat ARGV` here, typing `lines`: (stdout, stderr)."""
    out, err = (_Terminal() if tty else io.StringIO()), io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    main(["chat", *argv])
    return out.getvalue(), err.getvalue()


@pytest.fixture
def live(tiny_model: Callable[..., Path], tmp_path: Path) -> Iterator[Callable[..., object]]:
    from serve.conftest import start_server

    started = []

    def make(**overrides: object):
        server = start_server(model=str(tiny_model("qwen3")), data_dir=str(tmp_path), **overrides)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def _complete(url: str, messages: list[dict], headers: dict | None = None) -> str:
    """The server's own non-streamed reply to `messages` at chat's defaults (temp 0)."""
    body = {"messages": messages, "max_tokens": 12, "temperature": 0.0, "top_p": 1.0, "seed": 0}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_remote_chat_keeps_the_conversation(live, monkeypatch: pytest.MonkeyPatch) -> None:
    server = live()
    out, err = _chat_in_process(
        monkeypatch, "hello\nand then?\nr\nhello\nq\n", "--url", server.url, "-m", "12"
    )
    got = replies(out, "> \n")
    first = _complete(server.url, [{"role": "user", "content": "hello"}])
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "and then?"},
    ]
    assert got == [first, _complete(server.url, history), first] and first, err


def test_remote_chat_sends_the_api_key(live, monkeypatch: pytest.MonkeyPatch) -> None:
    server = live(api_key="sesame")
    out, err = _chat_in_process(monkeypatch, "hello\nq\n", "--url", server.v1, "-m", "12")
    assert replies(out, "> \n") == [] and "401" in err
    monkeypatch.undo()
    out, err = _chat_in_process(
        monkeypatch, "hello\nq\n", "--url", server.v1, "-m", "12", "--api-key", "sesame"
    )
    key = {"Authorization": "Bearer sesame"}
    assert replies(out, "> \n") == [
        _complete(server.url, [{"role": "user", "content": "hello"}], key)
    ]


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
def test_remote_reasoning_deltas_are_dimmed(
    live, tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tty: bool
) -> None:
    from serve.scripted import chat_prompt_len, script_server
    from transformers import AutoTokenizer

    server = live()
    model = script_server(server)
    tok = AutoTokenizer.from_pretrained(str(tiny_model("qwen3")))
    messages = [{"role": "user", "content": "2+2?"}]
    model.say(
        tok.encode("<think>\nadd them\n</think>\n\nFour.", add_special_tokens=False),
        chat_prompt_len(tok, messages),
    )
    out, _ = _chat_in_process(monkeypatch, "2+2?\nq\n", "--url", server.url, tty=tty)
    # The server splits the reasoning off; chat shows it between the markers again.
    shown = "<think>\nadd them\n</think>\n\nFour."
    if tty:
        assert f"{DIM}<think>\nadd them\n</think>{UNDIM}\n\nFour.\n" in out
    else:
        assert replies(out, "> \n") == [shown]
