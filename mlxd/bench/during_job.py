"""`mlxd bench serve --during-job fine_tune`: what a background fine-tuning job costs the agents.

One mlxd server; each round runs the agent fleet twice, once alone ("none") and once while a
LoRA job trains on the served model in its own process ("job"), the order swapped every round
so neither arm always runs in the other's wake. The job is started (and seen training) before
the job arm's agents begin, read again right after them, and cancelled with force; a round
where it was not running the whole time is marked invalid and left out of the medians. Each
arm has its own prompts: a second run of the same ones would hit the server's prefix cache."""

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from .during_job_report import markdown, round_ratios, summarize
from .fleet import Workload, banned_tokens, build_workload
from .job_load import TrainingJob, overlap
from .lora import agent_fields
from .serve import bench_command, load_tokenizer, resolve_model
from .side import Plan, ServedSide, run_one

ARMS = ("none", "job")
JOB_START_TIMEOUT_S = 600.0


def workloads(args: Any, tok: Any, banned: list[int]) -> dict[tuple[Any, ...], Workload]:
    """Each (arm, N, round)'s fleet, seeded apart; the warm-up's under ("warmup", 0)."""
    sampling = (getattr(args, "temperature", 0.0), getattr(args, "top_p", 1.0))
    shape = (args.turns, args.max_tokens, args.system_tokens)
    out: dict[tuple[Any, ...], Workload] = {}
    for arm in ARMS:
        for n in args.agents:
            for r in range(args.rounds):
                seed = f"{args.seed}:{arm}:n{n}:r{r}"
                out[arm, n, r] = build_workload(
                    tok, n, *shape, seed, banned, *sampling, min_tokens=args.min_tokens
                )
    if args.warmup:
        out["warmup", 0] = build_workload(
            tok, args.warmup, 2, 32, args.system_tokens, f"{args.seed}:w", banned, *sampling
        )
    return out


def job_round(side: ServedSide, job: TrainingJob, wl: Workload, r: int) -> dict[str, Any]:
    """The job arm of round r: the job training before the agents start, read after them."""
    before = job.start(JOB_START_TIMEOUT_S)
    print(f"[job] {job.id} training at step {before.step}", file=sys.stderr, flush=True)
    try:
        fields = agent_fields(side.args, "mlxd", side.model, wl.agents)
        run = run_one(side.srv, side.sampler, wl, r, fields)
        after = job.read()
    finally:
        final = job.cancel()
    seen = overlap(before, after) | {"id": job.id, "final_status": final}
    rate = seen["steps_per_s"] or 0.0
    print(
        f"[job] {job.id}: {seen['steps']} steps in {seen['span_s']:.2f} s ({rate:.2f} steps/s), "
        f"{before.status} -> {after.status}{'' if seen['valid'] else ', round INVALID'}",
        file=sys.stderr,
        flush=True,
    )
    return run | {"training": seen}


def run_during_job(args: Any) -> int:
    """Both arms round by round on one server; JSON / markdown written, the table printed;
    1 on any failed request or where no round was valid."""
    from .generate import environment

    model = resolve_model(args.model)
    tok, eos = load_tokenizer(model)
    banned = banned_tokens(model, eos)
    wls = workloads(args, tok, banned)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="mlxd-bench-during-job-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    hp = json.loads(args.job_hyperparameters) if args.job_hyperparameters else {}
    result: dict[str, Any] = {
        "command": bench_command(args, model) + f" --during-job {args.during_job}"
        + (f" --job-hyperparameters '{args.job_hyperparameters}'" if hp else ""),
        "env": environment(),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "model": {"name": model.name, "path": str(model), "system_tokens": args.system_tokens},
        "log_dir": str(log_dir),
        "rounds": {},
    }  # fmt: skip
    warm = {("warmup", 0): wls["warmup", 0]} if ("warmup", 0) in wls else {}
    with ServedSide("mlxd", Plan(args, model, warm, log_dir)) as side:
        result["server"] = side.out
        file_id = TrainingJob.upload(side.srv.url, f"{args.seed}:train")
        result["job"] = {"type": args.during_job, "training_file": file_id,
                         "hyperparameters": TrainingJob(side.srv.url, file_id, hp).hp}  # fmt: skip
        for n in args.agents:
            for r in range(args.rounds):
                order = ARMS if r % 2 == 0 else ARMS[::-1]
                one: dict[str, Any] = {"round": r, "order": list(order)}
                for arm in order:
                    wl = wls[arm, n, r]
                    if arm == "job":
                        one[arm] = job_round(side, TrainingJob(side.srv.url, file_id, hp), wl, r)
                    else:
                        fields = agent_fields(args, "mlxd", model, n)
                        one[arm] = run_one(side.srv, side.sampler, wl, r, fields)
                one["ratios"] = round_ratios(one)
                result["rounds"].setdefault(str(n), []).append(one)
                save_json(result, args)
    result["summary"] = summarize(result, args.agents)
    save_json(result, args)
    table = markdown(result)
    if args.markdown:
        Path(args.markdown).write_text(table)
    print(table, flush=True)
    return verdict(result)


def save_json(result: dict[str, Any], args: Any) -> None:
    # After every round, so a run killed at a time limit keeps what it measured.
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


def verdict(result: dict[str, Any]) -> int:
    rounds = [one for ones in result["rounds"].values() for one in ones]
    if errors := sum(one[arm]["figures"]["errors"] for one in rounds for arm in ARMS):
        print(f"mlxd bench serve: {errors} requests failed (see the JSON)", file=sys.stderr)
        return 1
    if invalid := sum(not one["job"]["training"]["valid"] for one in rounds):
        print(f"warning: {invalid} rounds without the job training throughout", file=sys.stderr)
    return 0 if any(one["job"]["training"]["valid"] for one in rounds) else 1
