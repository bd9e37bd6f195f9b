"""`mlxd bench serve` end to end on the tiny qwen3 model against both real servers (subprocesses
on free ports), and its statistics on hand-made numbers. Nothing here asserts a speed."""

import json
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from mlxd.bench.fleet import aggregate, build_workload, text_of_tokens
from mlxd.bench.serve import summarize
from mlxd.bench.side import engine_waits
from mlxd.cli import main

AGENTS, TURNS, MAX_TOKENS = (1, 2), 2, 8


def test_bench_serve_tiny_both_servers(
    tmp_path: Path, tiny_model: Callable[..., Path], capsys
) -> None:
    out, md, png = tmp_path / "serve.json", tmp_path / "serve.md", tmp_path / "serve.png"
    argv = ["bench", "serve", "--model", str(tiny_model("qwen3")), "--agents", "1,2"]
    argv += ["--turns", str(TURNS), "--max-tokens", str(MAX_TOKENS), "--system-tokens", "200"]
    argv += ["--json", str(out), "--markdown", str(md), "--plot", str(png)]
    argv += ["--warmup", "1", "--mlxd-args", "--batched-attention folded"]
    argv += ["--temperature", "0.8", "--baseline"]  # sampled agents; generate_step before N=1
    main([*argv, "--log-dir", str(tmp_path / "logs")])  # returns normally: no failed request
    result = json.loads(out.read_text())
    assert set(result["sides"]) == {"mlx_lm", "mlxd"}
    assert "--batched-attention" in result["sides"]["mlxd"]["command"]
    assert "--warmup 1" in result["command"] and "--temperature 0.8" in result["command"]
    # <|im_end|> is the tiny model's EOS; the other added tokens are control markers.
    assert 151645 in result["eos_ids"] and 151645 in result["banned_token_ids"]
    for side, data in result["sides"].items():
        assert data["ready_s"] > 0 and data["idle_rss_gb"] > 0.01
        assert data["cap"] == (2 if side == "mlxd" else 32)
        # The untimed warm-up: 1 agent x 2 short turns, outside every N's figures.
        assert data["warmup"]["requests"] == 2 and data["warmup"]["output_tokens"] == 64
        for n in AGENTS:
            (run,) = data["runs"][str(n)]
            fig, reqs = run["figures"], run["requests"]
            assert len(reqs) == fig["requests"] == n * TURNS
            assert sorted((r["agent"], r["turn"]) for r in reqs) == [
                (a, t) for a in range(n) for t in range(TURNS)
            ]
            # EOS banned: every turn generates exactly max_tokens.
            assert [r["completion_tokens"] for r in reqs] == [MAX_TOKENS] * len(reqs)
            assert fig["output_tokens"] == n * TURNS * MAX_TOKENS
            assert fig["errors"] == fig["short_replies"] == 0 and "log_tail" not in run
            assert all(r["finish_reason"] == "length" for r in reqs)
            # The history grows: turn 2's prompt holds turn 1's prompt, reply and a new message.
            for a in range(n):
                first, second = (
                    r for r in sorted(reqs, key=lambda r: r["turn"]) if r["agent"] == a
                )
                assert 200 <= first["prompt_tokens"] < second["prompt_tokens"]
            for key in ("ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms", "peak_rss_gb"):
                assert fig[key] > 0, (side, n, key)
            assert fig["ttft_p50_s"] <= fig["ttft_p99_s"] and fig["output_tok_s"] > 0
            # mlxd's /metrics splits each first token's wait; mlx_lm.server has no /metrics.
            if side == "mlxd":
                waits = run["engine_waits"]
                assert set(waits) == {"queue", "prefill"} and waits["prefill"] > 0
                assert waits["queue"] + waits["prefill"] < max(r["ttft_s"] for r in reqs)
            else:
                assert "engine_waits" not in run
    summary = result["summary"]
    assert set(summary) == {"1", "2"}
    assert summary["2"]["ratio"]["output_tok_s"] > 0
    table = md.read_text()
    assert "| 2 | mlxd |" in table and "| 2 | mlx-lm |" in table and "mlxd/mlx-lm" in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    base = result["baseline"]
    assert base["prompt_tokens"] == 240 and base["gen_tokens"] == MAX_TOKENS
    # One generate_step run (2 rounds) just before each server's one-agent round, none for N=2.
    for data in result["sides"].values():
        (run,) = data["baseline"]
        assert run["itl_p50_ms"] > 0 and len(run["round_p50_ms"]) == 2
        # mlxd's engine alone, alternated with generate_step in the same process.
        assert run["engine"]["itl_p50_ms"] > 0 and len(run["engine"]["round_p50_ms"]) == 2
    assert base["itl_p50_ms"] > 0 and len(base["round_p50_ms"]) == 4 and len(base["runs"]) == 2
    assert len(base["engine"]["round_p50_ms"]) == 4
    assert "mlxd's engine alone " in table and "through the server against it, per round" in table
    assert "1 agent, ITL p50 against mlx-lm generate_step alone" in table
    cells = table.rsplit("generate_step alone", 1)[1]
    assert "mlxd " in cells and cells.count(", per round ") == 3  # two sides, one engine
    # Each round's ITL and bound are in the log as they are measured (a run killed at a time
    # limit keeps them): the round lines carry the JSON's ITL, each bound its own line.
    err = capsys.readouterr().err.splitlines()
    for side, label in (("mlx_lm", "[mlx-lm]"), ("mlxd", "[mlxd]")):
        fig = result["sides"][side]["runs"]["1"][0]["figures"]
        (line,) = [x for x in err if x.startswith(f"{label} N=1 round 0:")]
        assert f"ITL p50 {fig['itl_p50_ms']:.2f} ms," in line
    bounds = [x for x in err if x.startswith("[generate_step] before round 0: ITL p50 ")]
    runs = [data["baseline"][0] for data in result["sides"].values()]
    assert bounds == [
        f"[generate_step] before round 0: ITL p50 {b['itl_p50_ms']:.2f} ms "
        f"(mlxd's engine alone {b['engine']['itl_p50_ms']:.2f} ms)"
        for b in runs
    ]


def test_bench_serve_interleaved_runs_round_r_on_each_server_in_turn(
    tmp_path: Path, tiny_model: Callable[..., Path], capsys
) -> None:
    out, md = tmp_path / "serve.json", tmp_path / "serve.md"
    argv = ["bench", "serve", "--model", str(tiny_model("qwen3")), "--agents", "2"]
    argv += ["--turns", "1", "--max-tokens", "4", "--system-tokens", "100", "--rounds", "3"]
    argv += ["--interleave", "--json", str(out), "--markdown", str(md), "--cache-limit-gb", "0.5"]
    main([*argv, "--log-dir", str(tmp_path / "logs")])
    result = json.loads(out.read_text())
    assert result["interleaved"] is True and "--interleave" in result["command"]
    assert "--cache-limit-gb 0.5" in result["command"]
    for side, data in result["sides"].items():
        assert [r["figures"]["requests"] for r in data["runs"]["2"]] == [2, 2, 2]
        # Both servers ran inside the capping wrapper, with the same cap.
        assert data["command"][1:4] == ["-m", "mlxd.bench.capped", "500000000"], side
    # Both servers stay up: round by round, the order swapped every round.
    order = [line.split(" N=")[0] + line.split("round")[1][:2] for line in
             capsys.readouterr().err.splitlines() if " N=2 round " in line]  # fmt: skip
    assert order == ["[mlx-lm] 0", "[mlxd] 0", "[mlxd] 1", "[mlx-lm] 1", "[mlx-lm] 2", "[mlxd] 2"]
    assert "mlxd/mlx-lm round by round (rounds run interleaved): N=2: tok/s " in md.read_text()


def test_round_ratios_pair_round_r_of_each_server() -> None:
    from mlxd.bench.rounds import round_ratios, rounds_line

    def runs(*figs: tuple[float, float | None]) -> list[dict]:
        return [{"figures": {"output_tok_s": t, "ttft_p99_s": p}} for t, p in figs]

    sides = {
        "mlx_lm": {"runs": {"8": runs((100, 2.0), (50, 4.0), (80, None)), "1": runs((9, 1))}},
        "mlxd": {"runs": {"8": runs((200, 0.5), (90, 1.0), (160, 0.4)), "1": runs((10, 1))}},
    }
    result = {"sides": sides, "interleaved": True}
    assert round_ratios(result, 8, "output_tok_s") == pytest.approx([2.0, 1.8, 2.0])
    assert round_ratios(result, 8, "ttft_p99_s") == pytest.approx([0.25, 0.25])  # None skipped
    line = rounds_line(result, [1, 8])
    assert line == (
        "\nmlxd/mlx-lm round by round (rounds run interleaved): "
        "N=8: tok/s 2.000x [1.800-2.000], TTFT p99 0.250x [0.250-0.250]\n"
    )  # N=1 has one round: nothing to spread
    assert "one side after the other" in rounds_line({"sides": sides}, [8])
    assert rounds_line({"sides": {"mlxd": sides["mlxd"]}}, [8]) == ""  # --only: no pairs


def _req(ttft: float, chunks: list[float], tokens: int, error: str | None = None) -> dict:
    return {
        "ttft_s": ttft,
        "chunk_s": chunks,
        "completion_tokens": tokens,
        "prompt_tokens": 100,
        "cached_tokens": 10,
        "error": error,
    }


def test_aggregate_on_hand_made_numbers() -> None:
    recs = [
        _req(0.1, [0.1, 0.2, 0.4], 3),  # gaps 100, 200 ms
        _req(0.3, [0.3, 0.6], 2),  # gap 300 ms, a short reply
        _req(0.2, [0.2, 0.25, 0.3], 3),  # gaps 50, 50 ms
        _req(0.0, [], 0, error="HTTP 500"),  # failed: counted, not measured
    ]
    fig = aggregate(recs, wall_s=2.0, max_tokens=3)
    assert fig["requests"] == 4 and fig["errors"] == 1 and fig["short_replies"] == 1
    recs[1]["requested_tokens"] = 2  # a drawn length (--min-tokens): met, not short
    assert aggregate(recs, wall_s=2.0, max_tokens=3)["short_replies"] == 0
    assert fig["output_tokens"] == 8 and fig["output_tok_s"] == 4.0
    assert fig["prompt_tokens"] == 300 and fig["cached_tokens"] == 30 and fig["chunks"] == 8
    # Nearest rank: p50 of (0.1, 0.2, 0.3) is 0.2, p99 the slowest.
    assert fig["ttft_p50_s"] == 0.2 and fig["ttft_p99_s"] == 0.3
    # Gaps 50, 50, 100, 200, 300 ms: p50 is the 3rd, p99 the 5th.
    assert fig["itl_p50_ms"] == pytest.approx(100.0)
    assert fig["itl_p99_ms"] == pytest.approx(300.0)
    empty = aggregate([], wall_s=1.0, max_tokens=3)
    assert empty["ttft_p50_s"] is None and empty["itl_p99_ms"] is None


def test_summarize_medians_spreads_and_ratios() -> None:
    def fig(tps: float, ttft: float) -> dict:
        keys = ("itl_p50_ms", "itl_p99_ms", "peak_rss_gb", "ttft_p99_s")
        base = dict.fromkeys(keys, 1.0) | {"requests": 4, "output_tokens": 32}
        return {"figures": base | {"output_tok_s": tps, "ttft_p50_s": ttft}}

    runs = {
        "mlx_lm": {"runs": {"4": [fig(10, 1.0), fig(20, 3.0), fig(30, 2.0)]}},
        "mlxd": {"runs": {"4": [fig(40, 1.0), fig(60, 0.5), fig(50, 2.0)]}},
    }
    per = summarize({"sides": runs}, [4])["4"]
    assert per["mlx_lm"]["output_tok_s"]["median"] == 20
    assert (per["mlxd"]["output_tok_s"]["min"], per["mlxd"]["output_tok_s"]["max"]) == (40, 60)
    assert per["ratio"]["output_tok_s"] == pytest.approx(2.5)
    assert per["ratio"]["ttft_p50_s"] == pytest.approx(0.5)
    assert per["mlxd"]["requests"] == 4 and per["mlxd"]["output_tokens"] == 32


class CharTokenizer:
    """One token per character: counts are easy to check by hand."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_the_baseline_line_puts_each_servers_lone_agent_against_generate_step() -> None:
    from mlxd.bench.baseline import baseline_line, pooled_baseline

    one = {
        "mlxd": {"itl_p50_ms": {"median": 10.5}},
        "mlx_lm": {"itl_p50_ms": {"median": 21.0}},
    }
    result = {"baseline": {"itl_p50_ms": 10.0, "prompt_tokens": 3640}, "summary": {"1": one}}
    line = baseline_line(result)
    assert "(10.00 ms, 3640-token prompt, run before each server round)" in line
    assert "mlxd 10.50 ms = 1.050x" in line and "mlx-lm 21.00 ms = 2.100x" in line
    assert "per round" not in line  # no side data: no pairs to show
    assert baseline_line({"summary": {"1": one}}) == ""  # no baseline run
    assert baseline_line({"baseline": {"error": "x"}, "summary": {"1": one}}) == ""
    run = {"round_p50_ms": [9.0, 12.0], "prompt_tokens": 40, "gen_tokens": 8, "itl_p50_ms": 1}
    pooled = pooled_baseline([run, {"error": "gone"}, dict(run, round_p50_ms=[10.0])])
    assert pooled["itl_p50_ms"] == 10.0 and len(pooled["runs"]) == 3  # the median of all rounds
    assert "error" in pooled_baseline([{"error": "gone"}])


def test_each_lone_agent_round_is_paired_with_the_bound_run_just_before_it() -> None:
    from mlxd.bench.baseline import baseline_line, paired_ratios

    def rounds(*itls: float) -> list[dict]:
        return [{"figures": {"itl_p50_ms": x}} for x in itls]

    # A slow stretch (bound 8 ms) and a fast one (4 ms): pooled, the server's 4.4 ms round
    # would look faster than the bound; paired, every round is 1.1x the run beside it.
    mlxd = {"runs": {"1": rounds(8.8, 4.4, 4.4)}}
    mlxd["baseline"] = [{"itl_p50_ms": 8.0}, {"itl_p50_ms": 4.0}, {"itl_p50_ms": 4.0}]
    assert paired_ratios(mlxd) == pytest.approx([1.1, 1.1, 1.1])
    failed = {"runs": {"1": rounds(5.0, 6.0)}, "baseline": [{"error": "x"}, {"itl_p50_ms": 4.0}]}
    assert paired_ratios(failed) == [1.5]  # a failed bound run pairs with nothing
    assert paired_ratios({"runs": {"2": rounds(1.0)}}) == []
    one = {"mlxd": {"itl_p50_ms": {"median": 4.4}}}
    result = {
        "baseline": {"itl_p50_ms": 4.0, "prompt_tokens": 40},
        "summary": {"1": one},
        "sides": {"mlxd": {"runs": {"1": rounds(8.8, 4.4, 4.0)}, "baseline": mlxd["baseline"]}},
    }
    assert "mlxd 4.40 ms = 1.100x, per round 1.100x [1.000-1.100]" in baseline_line(result)


def test_the_server_is_paired_with_mlxds_engine_alone_round_by_round() -> None:
    """The bound's process also times mlxd's engine (no server): the line puts it against
    generate_step, and each mlxd server round against the engine run just before it."""
    from mlxd.bench.baseline import baseline_line, pooled_baseline

    bases = [
        {"itl_p50_ms": 8.0, "round_p50_ms": [8.0], "prompt_tokens": 40, "gen_tokens": 8,
         "engine": {"itl_p50_ms": 6.0, "round_p50_ms": [6.0]}},
        {"itl_p50_ms": 4.0, "round_p50_ms": [4.0], "prompt_tokens": 40, "gen_tokens": 8,
         "engine": {"itl_p50_ms": 3.0, "round_p50_ms": [3.0]}},
    ]  # fmt: skip
    pooled = pooled_baseline(bases)
    assert pooled["engine"] == {"itl_p50_ms": 4.5, "round_p50_ms": [6.0, 3.0]}
    runs = [{"figures": {"itl_p50_ms": x}} for x in (6.6, 3.3)]
    one = {"mlxd": {"itl_p50_ms": {"median": 4.95}}}
    result = {"baseline": pooled, "summary": {"1": one}}
    result["sides"] = {"mlxd": {"runs": {"1": runs}, "baseline": bases}}
    line = baseline_line(result)
    assert "mlxd's engine alone 4.50 ms = 0.750x" in line  # 4.5 over the pooled 6.0
    assert "through the server against it, per round 1.100x [1.100-1.100]" in line
    # a record written before the bound timed the engine alone
    old = [{k: v for k, v in b.items() if k != "engine"} for b in bases]
    assert "engine" not in pooled_baseline(old)
    assert "engine alone" not in baseline_line(result | {"baseline": pooled_baseline(old)})


def test_prompt_words_are_deterministic_and_just_long_enough() -> None:
    tok = CharTokenizer()
    text = text_of_tokens(tok, random.Random("s"), 300)
    assert text == text_of_tokens(tok, random.Random("s"), 300)
    assert len(text) >= 300 and len(text.rsplit(" ", 1)[0]) < 300  # the fewest words
    a = build_workload(tok, 3, 2, 8, 100, "0:n3:r0", [7])
    b = build_workload(tok, 3, 2, 8, 100, "0:n3:r0", [7])
    c = build_workload(tok, 3, 2, 8, 100, "0:n8:r0", [7])
    assert a == b and a.system != c.system  # same per run, distinct across N
    assert len(set(a.tasks)) == 3 and [len(f) for f in a.followups] == [1, 1, 1]
    body = a.body([{"role": "user", "content": "x"}])
    assert body["logit_bias"] == {"7": -1e4} and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and "top_p" not in body  # greedy, as in earlier runs
    hot = build_workload(tok, 3, 2, 8, 100, "0:n3:r0", [7], 0.7, 0.95)
    assert hot.system == a.system  # the same prompts, sampled
    assert hot.body([])["temperature"] == 0.7 and hot.body([])["top_p"] == 0.95
    assert a.lengths is None and a.tokens(2, 1) == 8
    mixed = build_workload(tok, 3, 2, 8, 100, "0:n3:r0", [7], min_tokens=2)
    assert (mixed.system, mixed.tasks, mixed.followups) == (a.system, a.tasks, a.followups)
    assert mixed == build_workload(tok, 3, 2, 8, 100, "0:n3:r0", [7], min_tokens=2)
    drawn = [mixed.tokens(i, t) for i in range(3) for t in range(2)]
    assert all(2 <= n <= 8 for n in drawn) and len(set(drawn)) > 1, drawn
    assert mixed.body([], mixed.tokens(1, 0))["max_tokens"] == drawn[2]


def test_bench_serve_with_mixed_reply_lengths(tmp_path: Path, tiny_model) -> None:
    """--min-tokens: each request asks its own drawn length and gets it (rows end apart)."""
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--model", str(tiny_model("qwen3")), "--agents", "4", "--turns"]
    argv += ["2", "--max-tokens", "12", "--min-tokens", "3", "--system-tokens", "100"]
    main([*argv, "--only", "mlxd", "--json", str(out), "--log-dir", str(tmp_path / "logs")])
    result = json.loads(out.read_text())
    assert "--min-tokens 3" in result["command"]
    (run,) = result["sides"]["mlxd"]["runs"]["4"]
    reqs = run["requests"]
    assert [r["completion_tokens"] for r in reqs] == [r["requested_tokens"] for r in reqs]
    assert len({r["requested_tokens"] for r in reqs}) > 1 and run["figures"]["short_replies"] == 0


def test_bench_serve_refuses_min_tokens_above_max() -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--max-tokens", "8", "--min-tokens", "9"])
    assert "--min-tokens" in str(e.value.code)


@pytest.mark.parametrize("agents", ["0,2", "a", ""])
def test_bench_serve_refuses_bad_agent_lists(agents: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--agents", agents])
    assert e.value.code not in (0, None)


def test_engine_waits_are_per_run_means_of_the_metrics_totals() -> None:
    ep = '{endpoint="chat"}'
    before = {
        f"mlxd_request_queue_seconds_sum{ep}": 1.0,
        f"mlxd_request_queue_seconds_count{ep}": 2,
    }
    after = {f"mlxd_request_queue_seconds_sum{ep}": 4.0, f"mlxd_request_queue_seconds_count{ep}": 8}
    after |= {f"mlxd_request_prefill_seconds_sum{ep}": 3.0}
    after |= {f"mlxd_request_prefill_seconds_count{ep}": 4}
    assert engine_waits(before, after) == {"queue": 0.5, "prefill": 0.75}
    assert engine_waits(None, after) is None and engine_waits({}, {"x": 1.0}) is None


def test_a_refused_connection_is_retried_and_counted() -> None:
    """mlx_lm.server's backlog of 5 refuses some of 32 simultaneous connects: the client
    retries a request that got no answer, and records how often."""
    import asyncio

    import httpx

    from mlxd.bench.fleet import stream_chat

    attempts = []
    sse = (
        'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": "length"}]}\n\n'
        'data: {"choices": [], "usage": {"completion_tokens": 1, "prompt_tokens": 3}}\n\n'
        "data: [DONE]\n\n"
    )

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        if len(attempts) <= 2:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text=sse)

    async def go() -> dict:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await stream_chat(client, {"messages": []})

    rec = asyncio.run(go())
    assert rec["error"] is None and rec["retries"] == 2 and len(attempts) == 3
    assert rec["completion_tokens"] == 1 and rec["finish_reason"] == "length"


def test_an_error_frame_counts_as_the_requests_error() -> None:
    """A row that fails mid-stream ends with OpenAI's error object in a frame: the request is
    an error with the server's message, not a short reply."""
    import asyncio

    import httpx

    from mlxd.bench.fleet import stream_chat

    sse = (
        'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": null}]}\n\n'
        'data: {"error": {"message": "boom", "type": "server_error"}}\n\n'
        "data: [DONE]\n\n"
    )

    async def go() -> dict:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=sse))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await stream_chat(client, {"messages": []})

    rec = asyncio.run(go())
    assert rec["error"] == "RuntimeError: error frame: boom" and rec["retries"] == 0
    assert len(rec["chunk_s"]) == 1  # the token before it still counts


def test_a_round_with_errors_keeps_the_servers_log_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed round carries the server's last log lines in its record (an 8B failure once
    came back with no cause); a clean round does not."""
    from types import SimpleNamespace

    from mlxd.bench import fleet
    from mlxd.bench.fleet import Workload

    monkeypatch.setattr(fleet, "CONNECT_ATTEMPTS", 2)  # one retry, not 6.35 s of backoffs
    from mlxd.bench.servers import free_port
    from mlxd.bench.side import run_one

    class Sampler:
        peak = 0

        def reset(self) -> None:
            pass

    srv = SimpleNamespace(
        url=f"http://127.0.0.1:{free_port()}",  # nothing listens: every request fails
        side="mlxd",
        metrics=lambda: None,
        log_tail=lambda n=30: f"the last {n} lines",
        first_traceback=lambda: "Traceback ...",
        exit_code=lambda: -11,  # the server is gone: its signal is in the record
    )
    wl = Workload(1, 1, 4, "sys", ["task"], [[]], [])
    run = run_one(srv, Sampler(), wl, 0)
    assert run["figures"]["errors"] == 1
    assert run["log_tail"] == "the last 60 lines" and run["first_traceback"] == "Traceback ..."
    assert run["server_exit"] == -11


def test_the_first_traceback_is_the_cause_not_the_echoes() -> None:
    from mlxd.bench.servers import first_traceback

    log = "\n".join([
        "INFO started",
        "Traceback (most recent call last):",
        '  File "gen.py", line 3, in loop',
        "    mx.eval(x)",
        "RuntimeError: [cuda] out of memory",
        "Traceback (most recent call last):",
        '  File "server.py", line 9, in _inner',
        "RuntimeError: generation thread died",
    ])  # fmt: skip
    assert first_traceback(log).splitlines() == [
        "Traceback (most recent call last):",
        '  File "gen.py", line 3, in loop',
        "    mx.eval(x)",
        "RuntimeError: [cuda] out of memory",
    ]
    assert first_traceback("INFO fine\n") == ""
    assert first_traceback("Traceback (most recent call last):\n  cut").endswith("  cut")


def test_the_capping_wrapper_sets_mlxs_cache_limit_then_runs_the_module(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "probe_cap.py").write_text(
        "import sys\nimport mlx.core as mx\nprint(mx.set_cache_limit(0), sys.argv[1:])\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "mlxd.bench.capped", "123456", "probe_cap", "--x", "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "123456 ['--x', '1']"  # the cap it found, its own argv
    bad = subprocess.run([*cmd[:3], "lots", "probe_cap"], capture_output=True, text=True)
    assert bad.returncode != 0 and "usage" in bad.stderr


def test_a_failed_bound_says_why_and_the_side_is_not_called_paired() -> None:
    """On an 80 GB H100 every generate_step run beside mlxd's idle server ran out
    of memory, and the line read as if mlxd had been paired."""
    from mlxd.bench.baseline import baseline_line, failure_reason

    oom = "Traceback ...\n  File x\nRuntimeError: cudaMallocAsync(&data, size, stream) failed: "
    oom += "out of memory\n"
    why = failure_reason(oom)
    assert why.startswith("RuntimeError: cudaMallocAsync") and "--cache-limit-gb" in why
    assert failure_reason("Traceback\nValueError: bad model\n\n") == "ValueError: bad model"
    assert failure_reason("") == "no output"

    ok_rounds = [{"figures": {"itl_p50_ms": 13.6}}] * 2
    mlxd_rounds = [{"figures": {"itl_p50_ms": 8.0}}] * 2
    sides = {
        "mlx_lm": {"runs": {"1": ok_rounds}, "baseline": [{"itl_p50_ms": 7.0}] * 2},
        "mlxd": {"runs": {"1": mlxd_rounds}, "baseline": [{"error": "x", "reason": why}] * 2},
    }
    one = {"mlxd": {"itl_p50_ms": {"median": 8.0}}, "mlx_lm": {"itl_p50_ms": {"median": 13.6}}}
    result = {"baseline": {"itl_p50_ms": 7.0, "prompt_tokens": 40}, "summary": {"1": one}}
    line = baseline_line(result | {"sides": sides})
    assert "mlx-lm 13.60 ms = 1.943x, per round 1.943x" in line
    assert (
        "mlxd 8.00 ms = 1.143x (not paired: its 2 generate_step runs failed: RuntimeError" in line
    )
