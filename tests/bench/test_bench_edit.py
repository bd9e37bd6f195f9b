"""`mlxd bench serve --workload edit` and `--mlxd-variant`: the edit prompts (real source cut to
a token budget, one change asked), speculation's acceptance from usage fields, and the variant
sides' flags, ratios and table. Hand-made numbers and fake responses only: no server starts."""

import argparse
import asyncio
import json
import re

import httpx
import pytest

from mlxd.bench.accept import acceptance, drafts, same_replies
from mlxd.bench.edit import build_edit_workload, source_files
from mlxd.bench.fleet import aggregate, stream_chat
from mlxd.bench.plot import markdown
from mlxd.bench.serve import summarize
from mlxd.bench.variants import parse_variant, ratio_pairs, run_sides, server_flags
from mlxd.cli import main


class CharTokenizer:
    """One token per character: budgets are easy to check by hand."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def test_edit_prompts_fit_the_budget_differ_per_agent_and_ask_one_change() -> None:
    tok, budget = CharTokenizer(), 1500
    wl = build_edit_workload(tok, 4, 2, budget, "0:n4:r0")
    assert wl == build_edit_workload(tok, 4, 2, budget, "0:n4:r0")  # deterministic per seed
    other = build_edit_workload(tok, 4, 2, budget, "0:n4:r1")
    assert other.tasks != wl.tasks  # each round its own files: no prompt cache carries over
    assert len({s["file"] for s in wl.sources}) == 4 and len(set(wl.tasks)) == 4
    pool = {p.name: p for p in source_files(min_chars=5 * budget)}
    for i, (task, src) in enumerate(zip(wl.tasks, wl.sources, strict=True)):
        (code,) = FENCE.findall(task)
        # Within the budget, and not far under it (cut at a top-level statement).
        assert 0.75 * budget <= len(code) <= budget and src["tokens"] == len(code)
        # Whole lines of the real module, from the line the record names.
        lines = pool[src["file"]].read_text().splitlines(keepends=True)
        assert code == "".join(lines[src["line"] - 1 :])[: len(code) - 1] + "\n"
        # One change per turn, each on a function the excerpt defines.
        first, second = src["edits"]
        assert task.count("Please ") == 1 and f"Please {first}." in task
        assert wl.followups[i] == [f"Now also {second}. Reply with the whole file again."]
        for edit in src["edits"]:
            assert edit.startswith(("rename the function", "add a one-line docstring"))
            name = re.search(r"function `(\w+)`", edit).group(1)
            assert f"def {name}(" in code
            assert not (edit.startswith("rename") and name.endswith("__"))  # Python calls those
        # The reply may hold the whole file (and the edit) before its cap.
        assert wl.lengths[i] == [len(code) * 5 // 4 + 64] * 2
    body = wl.body([{"role": "user", "content": "x"}], wl.tokens(0, 0))
    assert body["temperature"] == 0.0 and "logit_bias" not in body  # greedy; EOS ends it
    assert body["max_tokens"] == wl.lengths[0][0] and wl.kind == "edit"


def test_drafts_and_acceptance_from_usage_fields() -> None:
    usage = {"completion_tokens": 50, "completion_tokens_details": {}}
    assert drafts(usage) == {"accepted_tokens": None, "rejected_tokens": None}
    details = {"accepted_prediction_tokens": 30, "rejected_prediction_tokens": 10}
    assert drafts({"completion_tokens_details": details}) == {
        "accepted_tokens": 30,
        "rejected_tokens": 10,
    }
    recs = [
        {"accepted_tokens": 30, "rejected_tokens": 10},
        {"accepted_tokens": 0, "rejected_tokens": 20},
        {"accepted_tokens": None, "rejected_tokens": None},  # said nothing: left out
    ]
    got = acceptance(recs)
    assert got["accepted_tokens"] == 30 and got["rejected_tokens"] == 30
    assert got["acceptance_rate"] == 0.5 and got["accepted_per_request"] == 15.0
    nothing = acceptance([{"accepted_tokens": 0, "rejected_tokens": 0}])
    assert nothing["acceptance_rate"] is None and nothing["accepted_per_request"] == 0.0
    assert acceptance([])["acceptance_rate"] is None


def test_stream_rate_counts_a_bursts_tokens_over_the_decode_span() -> None:
    """Speculation streams several tokens at once: the rate is tokens after the first over the
    first-to-last chunk span, per reply; its median over replies."""

    def rec(tokens: int, chunks: list[float]) -> dict:
        return {"ttft_s": chunks[0], "chunk_s": chunks, "completion_tokens": tokens}

    recs = [
        rec(5, [1.0, 1.0, 1.0, 1.5, 1.5]),  # 4 tokens in 0.5 s: 8 tok/s
        rec(3, [0.0, 1.0, 2.0]),  # 2 in 2 s: 1 tok/s
        rec(3, [0.0, 0.25, 0.5]),  # 2 in 0.5 s: 4 tok/s
        rec(1, [0.3]),  # one token: no span
    ]
    for r in recs:
        r |= {"error": None, "prompt_tokens": 1, "cached_tokens": None}
    assert aggregate(recs, 2.0, 5)["stream_tok_s_p50"] == 4.0
    assert aggregate(recs[3:], 2.0, 5)["stream_tok_s_p50"] is None


def _stream(details: dict | None) -> str:
    usage = {"completion_tokens": 12, "prompt_tokens": 3}
    usage |= {"completion_tokens_details": details} if details is not None else {}
    return (
        'data: {"choices": [{"delta": {"content": "x = 1"}, "finish_reason": "stop"}]}\n\n'
        f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"
    )


def _records(details: dict | None) -> list[dict]:
    async def go() -> dict:
        transport = httpx.MockTransport(lambda _: httpx.Response(200, text=_stream(details)))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await stream_chat(client, {"messages": []})

    rec = asyncio.run(go())
    rec.pop("text")
    return [rec | {"agent": 0, "turn": 0, "reply_sha1": "ab"}]


def _result(per_side: dict[str, dict | None]) -> dict:
    sides = {}
    for side, details in per_side.items():
        recs = _records(details)
        fig = aggregate(recs, 2.0, 100) | {"peak_rss_gb": 1.0}
        runs = {"1": [{"figures": fig, "requests": recs}]}
        sides[side] = {"runs": runs, "cap": 8, "flags": ["--speculative", "ngram"]}
    return {
        "command": "mlxd bench serve --workload edit",
        "args": {"turns": 1, "max_tokens": 256, "rounds": 1, "workload": "edit", "file_tokens": 9},
        "model": {"name": "m", "path": "/m", "system_tokens": 1},
        "env": {"device": "cpu", "cpu_count": 2, "mlx": "1", "mlx_lm": "1", "mlxd": "1"},
        "sides": sides,
    }


def test_the_report_shows_acceptance_per_variant_from_streamed_usage() -> None:
    spec = {"accepted_prediction_tokens": 9, "rejected_prediction_tokens": 3}
    result = _result({"mlx_lm": None, "mlxd": None, "mlxd-spec": spec})
    figs = {s: d["runs"]["1"][0]["figures"] for s, d in result["sides"].items()}
    assert figs["mlxd-spec"]["acceptance_rate"] == 0.75
    assert figs["mlxd-spec"]["accepted_per_request"] == 9.0
    assert figs["mlxd"]["acceptance_rate"] is None and figs["mlx_lm"]["accepted_tokens"] is None
    result["summary"] = summarize(result, [1])
    per = result["summary"]["1"]
    assert per["mlxd-spec"]["acceptance_rate"]["median"] == 0.75
    assert set(per["ratios"]) == {"mlxd/mlx_lm", "mlxd-spec/mlx_lm", "mlxd-spec/mlxd"}
    assert per["ratio"] == per["ratios"]["mlxd/mlx_lm"]
    result["same_replies"] = same_replies(result)
    assert result["same_replies"] == {"mlxd-spec": "1 of 1"}
    table = markdown(result)
    assert "| accept rate | accepted/req |" in table
    (row,) = [line for line in table.splitlines() if line.startswith("| 1 | mlxd-spec |")]
    assert row.endswith("| 0.750 | 9.0 | 1 | 12 |")
    (plain,) = [line for line in table.splitlines() if line.startswith("| 1 | mlxd |")]
    assert plain.endswith("| n/a | n/a | 1 | 12 |")
    assert "| 1 | mlxd-spec/mlxd | 1.000 |" in table and "| 1 | mlxd/mlx-lm |" in table
    assert "mlxd-spec: mlxd --speculative ngram; replies identical to mlxd's: 1 of 1" in table
    assert "edit: each agent sends its own Python file of up to 9 tokens and asks" in table
    result["workload"] = {"sources": {"1:0": [{"tokens": 7}, {"tokens": 9}]}}
    assert "file of up to 9 tokens (7-9 here)" in markdown(result)


def test_a_table_without_drafts_has_no_acceptance_columns() -> None:
    result = _result({"mlx_lm": None, "mlxd": None})
    result["summary"] = summarize(result, [1])
    assert "accept rate" not in markdown(result) and "ratios" in result["summary"]["1"]


def _parser_args(*argv: str) -> argparse.Namespace:
    from mlxd.cli.bench_serve import add_serve_parser

    p = argparse.ArgumentParser()
    add_serve_parser(p.add_subparsers())
    return p.parse_args(["serve", *argv])


def test_the_variant_flag_parses_into_its_own_mlxd_side() -> None:
    args = _parser_args(
        "--mlxd-args", "--batch-wait 2", "--mlxd-variant", "spec=--speculative ngram",
        "--mlxd-variant", "k8=--speculative ngram --num-speculative-tokens 8",
    )  # fmt: skip
    assert args.mlxd_variant == [
        ("spec", "--speculative ngram"),
        ("k8", "--speculative ngram --num-speculative-tokens 8"),
    ]
    assert run_sides(args) == ["mlx_lm", "mlxd", "mlxd-spec", "mlxd-k8"]
    # A variant's flags come after --mlxd-args: the last flag wins.
    assert server_flags(args, "mlxd-spec") == ["--batch-wait", "2", "--speculative", "ngram"]
    assert server_flags(args, "mlxd") == ["--batch-wait", "2"]
    assert server_flags(args, "mlx_lm") == []
    args.only = "mlxd"
    assert run_sides(args) == ["mlxd", "mlxd-spec", "mlxd-k8"]
    args.only = "mlx-lm"
    assert run_sides(args) == ["mlx_lm"]
    pairs = ratio_pairs(["mlx_lm", "mlxd", "mlxd-spec"])
    assert pairs == [("mlxd", "mlx_lm"), ("mlxd-spec", "mlx_lm"), ("mlxd-spec", "mlxd")]
    assert ratio_pairs(["mlxd", "mlxd-spec"]) == [("mlxd-spec", "mlxd")]  # --only mlxd
    assert _parser_args().mlxd_variant is None and _parser_args().workload == "fleet"


@pytest.mark.parametrize("bad", ["spec", "=--speculative ngram", "a b=--x", "s=--x 'open"])
def test_a_malformed_variant_is_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_variant(bad)
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--mlxd-variant", bad])
    assert e.value.code not in (0, None)


def test_repeated_variant_names_and_min_tokens_with_edit_are_refused() -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--mlxd-variant", "a=--x", "--mlxd-variant", "a=--y"])
    assert "names repeat" in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--workload", "edit", "--min-tokens", "4"])
    assert "--min-tokens" in str(e.value.code)


def test_bench_serve_edit_with_a_variant_end_to_end(tmp_path, tiny_model) -> None:
    """--only mlxd with one variant on the tiny model: two mlxd servers, the variant's flags
    last on its command line, each agent's file and change recorded, no request failed."""
    out, md = tmp_path / "edit.json", tmp_path / "edit.md"
    argv = ["bench", "serve", "--model", str(tiny_model("qwen3")), "--agents", "2"]
    argv += ["--workload", "edit", "--file-tokens", "64", "--only", "mlxd"]
    argv += ["--mlxd-variant", "folded=--batched-attention folded"]
    main([*argv, "--json", str(out), "--markdown", str(md), "--log-dir", str(tmp_path / "logs")])
    result = json.loads(out.read_text())
    assert list(result["sides"]) == ["mlxd", "mlxd-folded"]
    assert result["sides"]["mlxd-folded"]["command"][-2:] == ["--batched-attention", "folded"]
    assert "--batched-attention" not in result["sides"]["mlxd"]["command"]
    assert "--workload edit --file-tokens 64" in result["command"]
    assert "--mlxd-variant 'folded=--batched-attention folded'" in result["command"]
    (sources,) = result["workload"]["sources"].values()
    assert len(sources) == 2 and all(0 < s["tokens"] <= 64 for s in sources)
    for data in result["sides"].values():
        (run,) = data["runs"]["2"]
        assert run["figures"]["errors"] == 0 and run["figures"]["requests"] == 2
        reqs = sorted(run["requests"], key=lambda q: q["agent"])
        for req, src in zip(reqs, sources, strict=True):
            assert 0 < req["completion_tokens"] <= req["requested_tokens"]
            assert req["requested_tokens"] == src["tokens"] * 5 // 4 + 64
            assert req["prompt_tokens"] > src["tokens"]  # the file and the ask
            assert len(req["reply"]) == req["reply_chars"] > 0  # kept to read the edit off
    assert set(result["same_replies"]) == {"mlxd-folded"}
    assert "| 2 | mlxd-folded/mlxd |" in md.read_text()
