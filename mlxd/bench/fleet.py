"""The agent fleet of `mlxd bench serve`: N agents share one long system prompt, each with its own
task, each running T turns of streamed chat completions; all start together. Prompts are random
but deterministic words, the same for every server; EOS and control tokens are banned with
`logit_bias` so every turn generates exactly `max_tokens` tokens."""

import asyncio
import hashlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .accept import acceptance, drafts
from .report import percentile

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
BAN = -1e4  # additive: below any real logit, and finite in float16 / bfloat16 too


def words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def text_of_tokens(tokenizer: Any, rng: random.Random, target: int) -> str:
    """Random words, cut to the fewest that reach `target` tokens under the model's tokenizer
    (every word is at least one token, so `target` words always suffice)."""
    pool = words(rng, max(8, target))

    def count(k: int) -> int:
        return len(tokenizer.encode(" ".join(pool[:k]), add_special_tokens=False))

    lo, hi = 1, len(pool)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if count(mid) >= target else (mid + 1, hi)
    return " ".join(pool[:lo])


def banned_tokens(model: Path, eos_ids: list[int]) -> list[int]:
    """EOS ids plus the tokenizer's added tokens (<|im_start|>, <think>, <tool_call>, ...): a
    control token would end the turn or switch a server into reasoning / tool mode, where it
    chunks the stream differently."""
    ids = set(eos_ids)
    tok_file = model / "tokenizer.json"
    if tok_file.exists():
        ids |= {int(t["id"]) for t in json.loads(tok_file.read_text()).get("added_tokens", [])}
    return sorted(ids)


@dataclass(frozen=True)
class Workload:
    agents: int
    turns: int
    max_tokens: int
    system: str
    tasks: list[str]  # the first user message of each agent
    followups: list[list[str]]  # per agent: the user messages of turns 2..T
    banned: list[int]
    temperature: float = 0.0  # > 0: each agent samples (its own sampler on either server)
    top_p: float = 1.0
    lengths: list[list[int]] | None = None  # per agent and turn: its reply's tokens (--min-tokens)
    kind: str = "fleet"  # or "edit" (edit.py): replies end at EOS, nothing banned
    sources: list[dict[str, Any]] | None = None  # edit: each agent's file, cut and changes

    def tokens(self, agent: int, turn: int) -> int:
        return self.lengths[agent][turn] if self.lengths else self.max_tokens

    def body(self, messages: list[dict[str, str]], max_tokens: int | None = None) -> dict[str, Any]:
        body = {
            "messages": messages,
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.banned:
            body["logit_bias"] = {str(t): BAN for t in self.banned}
        return body | ({"top_p": self.top_p} if self.top_p != 1.0 else {})


def build_workload(
    tokenizer: Any,
    agents: int,
    turns: int,
    max_tokens: int,
    system_tokens: int,
    seed: str,
    banned: list[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    min_tokens: int | None = None,
) -> Workload:
    """`seed` names the run (e.g. "0:n8:r0"): distinct per N and round, so that no prompt cache
    carries a system prompt from one run into the next. With `min_tokens` below `max_tokens`
    each reply's length is drawn from [min_tokens, max_tokens], so rows end at different steps."""
    rng = random.Random(seed)
    system = text_of_tokens(tokenizer, rng, system_tokens)
    tasks = [f"You are agent {i}. Your task: {' '.join(words(rng, 24))}" for i in range(agents)]
    followups = [
        [f"Turn {t + 2}: go on with {' '.join(words(rng, 12))}" for t in range(turns - 1)]
        for _ in range(agents)
    ]
    lengths = None
    if min_tokens is not None and min_tokens < max_tokens:  # drawn last: the prompts stay put
        lengths = [[rng.randint(min_tokens, max_tokens) for _ in range(turns)] for _ in tasks]
    return Workload(
        agents, turns, max_tokens, system, tasks, followups, banned, temperature, top_p, lengths
    )


# Connection attempts per request: mlx_lm.server's listen backlog is socketserver's 5, so
# 32 agents connecting at once see refused or reset connections; a client retries them.
CONNECT_ATTEMPTS = 8


async def stream_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request, timed at the client from its first attempt: `chunk_s` holds the
    arrival time of every chunk that carries text, reasoning or tool calls. A connection
    dropped before any answer is retried (counted in `retries`), as a real client would."""
    t0 = time.perf_counter()
    for attempt in range(CONNECT_ATTEMPTS):
        rec = await _attempt(client, body, t0)
        rec["retries"] = attempt
        if not rec.pop("retryable") or attempt == CONNECT_ATTEMPTS - 1:
            return rec
        await asyncio.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


async def _attempt(client: httpx.AsyncClient, body: dict[str, Any], t0: float) -> dict[str, Any]:
    rec: dict[str, Any] = {"ttft_s": None, "chunk_s": [], "error": None, "finish_reason": None}
    rec["model"] = None  # as the server names it: an adapter's name where one answered
    rec["retryable"] = False
    usage: dict[str, Any] = {}
    text: list[str] = []
    answered = False
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            answered = True
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                now = time.perf_counter() - t0
                if not line.startswith("data:") or (data := line[5:].strip()) == "[DONE]":
                    continue
                msg = json.loads(data)
                if isinstance(err := msg.get("error"), dict):  # a row failed mid-stream
                    raise RuntimeError(f"error frame: {err.get('message')}")
                usage = msg.get("usage") or usage
                rec["model"] = msg.get("model") or rec["model"]
                for ch in msg.get("choices") or []:
                    d = ch.get("delta") or {}
                    if d.get("content") or d.get("reasoning") or d.get("tool_calls"):
                        rec["chunk_s"].append(now)
                    text.append(d.get("content") or "")
                    rec["finish_reason"] = ch.get("finish_reason") or rec["finish_reason"]
    except Exception as e:  # noqa: BLE001 - recorded, counted, and the agent stops
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["retryable"] = not answered and isinstance(e, httpx.TransportError)
    rec["ttft_s"] = rec["chunk_s"][0] if rec["chunk_s"] else None
    rec["completion_tokens"] = usage.get("completion_tokens", 0)
    rec["prompt_tokens"] = usage.get("prompt_tokens", 0)
    rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    rec |= drafts(usage)
    rec["text"] = "".join(text)
    return rec


async def agent(
    client: httpx.AsyncClient, wl: Workload, i: int, t0: float, fields: dict[str, Any] | None = None
) -> list[dict]:
    """Agent i's T turns: its history grows by the reply and a new user message each turn;
    `fields` join every request's body (e.g. the agent's adapter, lora.py)."""
    messages = [{"role": "system", "content": wl.system}, {"role": "user", "content": wl.tasks[i]}]
    out = []
    for turn in range(wl.turns):
        if turn:
            messages.append({"role": "user", "content": wl.followups[i][turn - 1]})
        sent = time.perf_counter() - t0
        want = wl.tokens(i, turn)
        rec = await stream_chat(client, wl.body(messages, want) | (fields or {}))
        text = rec.pop("text")
        out.append({"agent": i, "turn": turn, "sent_s": sent, "requested_tokens": want, **rec})
        out[-1]["reply_chars"] = len(text)
        # Greedy replies compared across servers (speculation must not change a token).
        out[-1]["reply_sha1"] = hashlib.sha1(text.encode()).hexdigest()
        if wl.kind == "edit":  # kept: whether the model made the change is read off it
            out[-1]["reply"] = text
        if rec["error"]:
            break
        messages.append({"role": "assistant", "content": text})
    return out


async def run_fleet(
    url: str, wl: Workload, timeout_s: float, fields: list[dict[str, Any]] | None = None
) -> tuple[list[dict], float]:
    """All agents at once (agent i's requests with `fields[i]`); returns every request's record
    and the wall time of the whole run."""
    limits = httpx.Limits(max_connections=wl.agents + 4, max_keepalive_connections=wl.agents + 4)
    timeout = httpx.Timeout(timeout_s, connect=60.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        extra = fields or [{} for _ in range(wl.agents)]
        per_agent = await asyncio.gather(
            *(agent(client, wl, i, t0, extra[i]) for i in range(wl.agents))
        )
        wall = time.perf_counter() - t0
    return [r for recs in per_agent for r in recs], wall


def _pct(xs: list[float], q: float) -> float | None:
    return percentile(xs, q) if xs else None


def aggregate(records: list[dict[str, Any]], wall_s: float, max_tokens: int) -> dict[str, Any]:
    """One run's figures: aggregate output tok/s over the wall time, TTFT and inter-chunk gap
    percentiles (nearest rank) over all requests, and the token counts."""
    ok = [r for r in records if r["error"] is None]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    gaps = [1e3 * (b - a) for r in ok for a, b in zip(r["chunk_s"], r["chunk_s"][1:], strict=False)]
    # A stream's tokens after its first over its decode span: a speculative step's tokens come
    # in a burst, so a chunk gap's median no longer reads as a rate.
    spans = [(r["completion_tokens"] - 1, r["chunk_s"][-1] - r["chunk_s"][0]) for r in ok]
    rates = [n / s for n, s in spans if n > 0 and s > 0]
    out_tokens = sum(r["completion_tokens"] for r in ok)
    cached = [r["cached_tokens"] for r in ok if r["cached_tokens"] is not None]
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "short_replies": sum(
            r["completion_tokens"] < r.get("requested_tokens", max_tokens) for r in ok
        ),
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
        "cached_tokens": sum(cached) if cached else None,
        "chunks": sum(len(r["chunk_s"]) for r in ok),
        "wall_s": wall_s,
        "output_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "stream_tok_s_p50": _pct(rates, 50),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "itl_p50_ms": _pct(gaps, 50),
        "itl_p99_ms": _pct(gaps, 99),
    } | acceptance(ok)
