"""`mlxd jobs`: a running server's managed jobs (fine-tuning, quantization) from the terminal:
list them, show one, follow its log with a progress bar, cancel, stop or resume it."""

import argparse
import json
import sys
import time
from typing import Any

import httpx

from .chat_remote import base_url

TIMEOUT = httpx.Timeout(10.0, read=None)  # a followed log stays open while the job runs


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "jobs",
        help="list, follow and control a server's fine-tuning and quantization jobs",
        description="A running `mlxd serve`'s jobs (POST /v1/jobs or /v1/fine_tuning/jobs "
        "creates them). With no action: the list.",
    )
    p.add_argument(
        "--url", default="http://127.0.0.1:8080", help="the server (default: %(default)s)"
    )
    p.add_argument("--api-key", default=None, help="the server's API key (sent as a Bearer token)")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    ls = actions.add_parser("list", help="every job, newest first")
    ls.add_argument("--json", action="store_true", help="the raw list")
    for name, text in (("show", "one job as JSON"), ("cancel", "cancel a job (a running one "
                       "stops at its next step and keeps its checkpoint)"),
                       ("stop", "end a running fine-tuning job now; it succeeds with the "
                        "adapter as it is"), ("resume", "run a failed or cancelled fine-tuning "
                        "job again from its last checkpoint")):  # fmt: skip
        a = actions.add_parser(name, help=text)
        a.add_argument("job_id")
        if name == "cancel":
            a.add_argument("--force", action="store_true", help="kill the job's process at once")
    logs = actions.add_parser("logs", help="a job's events (-f: follow with a progress bar)")
    logs.add_argument("job_id")
    logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(base_url=base_url(args.url), headers=headers, timeout=TIMEOUT)


def _check(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text
        raise SystemExit(f"mlxd jobs: error: {r.status_code}: {message}")
    return r.json()


def _row(job: dict) -> str:
    progress = f"{100 * job['progress']:5.1f}%"
    out = job.get("output_model") or (job.get("error") or {}).get("code") or ""
    return (
        f"{job['id']:<32} {job['type']:<10} {job['status']:<10} {progress} {job['model']:<24} {out}"
    )


def _event_line(e: dict) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(e["created_at"]))
    return f"{stamp} {e.get('level', 'info'):<5} {e.get('message', '')}"


def _follow(client: httpx.Client, job_id: str) -> int:
    """Print events as they land, a progress bar below them; the exit status is 0 only when
    the job succeeded."""
    from tqdm import tqdm

    bar = tqdm(total=1000, unit="‰", file=sys.stderr, bar_format="{l_bar}{bar}| {postfix}")
    status = "queued"
    with client.stream("GET", f"/jobs/{job_id}/events", params={"stream": "true"}) as r:
        if r.status_code >= 400:
            r.read()
            _check(r)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            item = json.loads(line[6:])
            if item.get("object") == "job":
                status = item["status"]
                bar.n = int(1000 * item["progress"])
                eta = f", ETA {item['eta_s']:.0f} s" if item.get("eta_s") else ""
                bar.set_postfix_str(f"{status} {item.get('stage') or ''}{eta}".strip())
                bar.refresh()
            else:
                bar.write(_event_line(item))
    bar.close()
    return 0 if status == "succeeded" else 1


def run(args: argparse.Namespace) -> None:
    with _client(args) as client:
        action = args.action or "list"
        if action == "list":
            jobs = _check(client.get("/jobs", params={"limit": 1000}))["data"]
            if getattr(args, "json", False):
                print(json.dumps(jobs, indent=2))
            for job in [] if getattr(args, "json", False) else jobs:
                print(_row(job))
        elif action == "show":
            print(json.dumps(_check(client.get(f"/jobs/{args.job_id}")), indent=2))
        elif action in ("cancel", "stop", "resume"):
            params = {"force": "true"} if getattr(args, "force", False) else None
            print(_row(_check(client.post(f"/jobs/{args.job_id}/{action}", params=params))))
        elif action == "logs" and args.follow:
            sys.exit(_follow(client, args.job_id))
        else:
            for e in _check(client.get(f"/jobs/{args.job_id}/events", params={"limit": 1000}))[
                "data"
            ]:
                print(_event_line(e))
