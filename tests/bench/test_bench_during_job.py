"""`mlxd bench serve --during-job fine_tune` end to end on the tiny qwen3 model: one mlxd
server, the agents alone and while a real LoRA job trains (its own process); the job seen
running across the job round, then cancelled. Nothing here asserts a speed."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from mlxd.bench.during_job_report import round_ratios, summarize
from mlxd.bench.job_load import JobState, overlap, training_jsonl
from mlxd.cli import main

TURNS, MAX_TOKENS = 3, 64
METRICS = ("itl_p99_ms", "itl_p50_ms", "ttft_p99_s", "output_tok_s")


def test_during_job_runs_both_arms_with_the_job_training(
    tmp_path: Path, tiny_model: Callable[..., Path], capsys
) -> None:
    out, md = tmp_path / "job.json", tmp_path / "job.md"
    argv = ["bench", "serve", "--model", str(tiny_model("qwen3")), "--agents", "2"]
    argv += ["--turns", str(TURNS), "--max-tokens", str(MAX_TOKENS), "--system-tokens", "64"]
    hp = '{"max_seq_length": 64, "batch_size": 1}'  # a short step: several in a round on CPU
    argv += ["--during-job", "fine_tune", "--job-hyperparameters", hp]
    main([*argv, "--json", str(out), "--markdown", str(md), "--log-dir", str(tmp_path / "logs")])
    result = json.loads(out.read_text())
    assert "--during-job fine_tune" in result["command"]
    assert result["job"]["hyperparameters"]["max_seq_length"] == 64  # the override reached it
    assert result["job"]["hyperparameters"]["iters"] == 1_000_000
    (one,) = result["rounds"]["2"]
    assert one["order"] == ["none", "job"]
    for arm in ("none", "job"):
        fig = one[arm]["figures"]
        assert fig["requests"] == 2 * TURNS and fig["errors"] == 0
        assert fig["output_tokens"] == 2 * TURNS * MAX_TOKENS
        assert all(fig[k] > 0 for k in METRICS), arm
    # Each arm its own prompts: the job arm cannot ride the first arm's prefix cache.
    firsts = {arm: min(r["prompt_tokens"] for r in one[arm]["requests"]) for arm in ("none", "job")}
    assert all(n >= 64 for n in firsts.values())
    training = one["job"]["training"]
    assert training["before"]["status"] == training["after"]["status"] == "running"
    assert training["after"]["step"] > training["before"]["step"] >= 2
    assert training["valid"] and training["steps"] > 0 and training["steps_per_s"] > 0
    assert training["final_status"] == "cancelled" and training["id"].startswith("ftjob-")
    for key in METRICS:
        want = one["job"]["figures"][key] / one["none"]["figures"][key]
        assert one["ratios"][key] == want
        assert result["summary"]["2"]["ratios"][key]["median"] == want
    per = result["summary"]["2"]
    assert per["valid_rounds"] == 1 and per["invalid_rounds"] == []
    assert per["job_steps_per_s"]["median"] == training["steps_per_s"]
    table = md.read_text()
    assert "| 2 | ITL p99 (ms) |" in table and "job/none per round" in table
    assert "1 valid rounds; the job trained" in table and "INVALID" not in table
    err = capsys.readouterr().err
    assert f"[job] {training['id']}: {training['steps']} steps in " in err


def _state(t: float, status: str, step: int) -> JobState:
    return JobState(t, status, "training", step)


@pytest.mark.parametrize(
    "before, after, valid",
    [
        (_state(1.0, "running", 3), _state(3.0, "running", 7), True),
        (_state(1.0, "running", 3), _state(3.0, "failed", 7), False),  # died mid-round
        (_state(1.0, "queued", 0), _state(3.0, "running", 2), False),  # not yet running
        (_state(1.0, "running", 3), _state(3.0, "running", 3), False),  # stalled: no step
    ],
)  # fmt: skip
def test_a_round_is_valid_only_with_the_job_running_and_training_throughout(
    before: JobState, after: JobState, valid: bool
) -> None:
    seen = overlap(before, after)
    assert seen["valid"] is valid
    assert seen["steps"] == after.step - before.step and seen["span_s"] == 2.0


def test_invalid_rounds_stay_out_of_the_medians() -> None:
    def arm(itl: float) -> dict:
        return {"figures": {"itl_p99_ms": itl, "itl_p50_ms": 1.0, "ttft_p99_s": 0.5,
                            "output_tok_s": 100.0}}  # fmt: skip

    rounds = []
    for r, (none, job, valid) in enumerate([(10.0, 12.0, True), (10.0, 50.0, False),
                                            (20.0, 30.0, True)]):  # fmt: skip
        one = {"round": r, "none": arm(none), "job": arm(job)}
        one["job"]["training"] = {"valid": valid, "steps_per_s": 2.0 + r}
        one["ratios"] = round_ratios(one)
        rounds.append(one)
    assert [one["ratios"]["itl_p99_ms"] for one in rounds] == [1.2, 5.0, 1.5]
    per = summarize({"rounds": {"8": rounds}}, [8])["8"]
    assert per["valid_rounds"] == 2 and per["invalid_rounds"] == [1]
    assert per["ratios"]["itl_p99_ms"]["values"] == [1.2, 1.5]
    assert per["ratios"]["itl_p99_ms"]["median"] == pytest.approx(1.35)
    assert per["none"]["itl_p99_ms"]["median"] == 15.0
    assert per["job_steps_per_s"]["values"] == [2.0, 4.0]


def test_the_training_file_is_seeded_chat_jsonl() -> None:
    lines = training_jsonl("s").decode().splitlines()
    assert len(lines) == 64 and training_jsonl("s") == training_jsonl("s") != training_jsonl("t")
    roles = [m["role"] for m in json.loads(lines[0])["messages"]]
    assert roles == ["user", "assistant"]
