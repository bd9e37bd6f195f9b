"""A hostile run: `mlxd serve` (the embedded default model unless --model) as a subprocess on a
free port, then N requests with a deadline each: hostile JSON bodies for every route from the
fuzz strategies (tests/fuzz/bodies.py), malformed HTTP on raw sockets (tests/fuzz/raw.py: bad
JSON, wrong content types, lying lengths, slow and half-sent requests, streams cut mid-way) and
bursts of many requests at once. The server runs with a --request-timeout below the client's
deadline. Prints counts by status, the 5xx and the unanswered (both must be 0), the server's
RSS before and after, and the wall time; exits 1 if either count is not 0.

    .venv/bin/python -m bench.probes.hostile_run --deadline 300  # 10,000 requests
    .venv/bin/python -m bench.probes.hostile_run --requests 200 --model DIR --code /other/tree
"""

import argparse
import asyncio
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from mlxd.bench.servers import free_port
from mlxd.config import child_environment
from tests.fuzz import raw
from tests.fuzz.bodies import ROUTES, request
from tests.fuzz.checks import describe, problem, stream_refused

ROOT = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> float:
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True)
    return int(out.stdout.strip() or 0) / 1024


def start_server(a: argparse.Namespace, data_dir: str) -> tuple[subprocess.Popen, str]:
    """`mlxd serve` on a free port, offline (a hostile model name never reaches the network),
    running the code of `--code` (this tree by default); returns it once /health answers."""
    port = free_port()
    model = ["--model", a.model] if a.model else []
    cmd = [str(ROOT / ".venv/bin/mlxd"), "serve", "--port", str(port), "--data-dir", data_dir,
           "--max-tokens", "4", "--request-timeout", str(a.request_timeout or 0.8 * a.deadline),
           *model, *a.serve_arg]  # fmt: skip
    env = {**child_environment(str(a.code)), "HF_HUB_OFFLINE": "1"}
    log = open(Path(data_dir) / "server.log", "w")  # noqa: SIM115 - lives as long as the child
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + a.start_timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"the server did not start: see {log.name}")


def generate(count: int, seed: int, into: "queue.Queue[Any]") -> None:
    """Hostile requests over every route from the fuzz strategies, `count` of them, handed to
    `into` as they are drawn (None at the end); runs in a thread beside the sending."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis import strategies as st

    @fixed_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.sampled_from(ROUTES).flatmap(request))
    def draw(req: tuple[str, str, Any]) -> None:
        into.put(req)

    try:
        draw()
    finally:
        into.put(None)


class Tally:
    def __init__(self) -> None:
        self.status: Counter[str] = Counter()
        self.failures: list[str] = []
        self.unanswered: list[str] = []

    def fail(self, line: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(line)


async def send_json(client: httpx.AsyncClient, req: tuple, deadline: float, t: Tally) -> None:
    method, path, body = req
    content = None if body is None else json.dumps(body)
    headers = {"content-type": "application/json"} if body is not None else {}
    try:
        r = await asyncio.wait_for(
            client.request(method, path, content=content, headers=headers), deadline
        )
    except (TimeoutError, httpx.TimeoutException):
        t.status["unanswered"] += 1
        t.unanswered.append(describe(method, path, body, "no answer in time", ""))
        return
    except httpx.InvalidURL:  # too long for the client to send: not the server's answer
        t.status["not sent (URL too long)"] += 1
        return
    except httpx.HTTPError as e:
        t.status[f"error {type(e).__name__}"] += 1
        t.fail(describe(method, path, body, type(e).__name__, str(e)))
        return
    refused = r.status_code == 200 and stream_refused(r.text)  # a 429 after the status line
    t.status["200 (stream ended 429)" if refused else str(r.status_code)] += 1
    why = problem(path, r.status_code, r.headers.get("content-type", ""), r.text)
    if why is not None:
        t.fail(f"{why}: {describe(method, path, body, r.status_code, r.text)}")


async def send_raw(host: str, port: int, case: raw.RawCase, deadline: float, t: Tally) -> None:
    try:
        outcome, status = await raw.send(host, port, case, deadline)
    except OSError as e:
        outcome, status = f"error {type(e).__name__}", None
    t.status[f"raw {status if status is not None else outcome}"] += 1
    if outcome == "timeout":
        t.unanswered.append(f"raw {case.name}: no answer in time")
    elif (status or 0) >= 500:
        t.fail(f"raw {case.name}: {status}")


async def fire(a: argparse.Namespace, url: str, t: Tally) -> int:
    """Every request: raw cases first in a loop, the JSON ones as the thread draws them, with
    a burst of `--burst` at once every 1,000. Returns how many were sent."""
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    n_raw = max(a.requests // 10, 1)
    all_raw = raw.cases()
    todo: queue.Queue[Any] = queue.Queue(maxsize=4 * a.burst)
    threading.Thread(target=generate, args=(a.requests - n_raw, a.seed, todo), daemon=True).start()
    gate = asyncio.Semaphore(a.concurrency)
    sent = 0
    limits = httpx.Limits(max_connections=a.burst + a.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=a.deadline, limits=limits) as client:

        async def one(job: Any, burst: bool) -> None:
            async with gate if not burst else _nothing():
                if isinstance(job, raw.RawCase):
                    await send_raw(host, port, job, a.deadline, t)
                else:
                    await send_json(client, job, a.deadline, t)

        tasks: set[asyncio.Task] = set()
        raw_left = n_raw
        loop = asyncio.get_running_loop()
        while True:
            if raw_left > 0 and sent % 10 == 0:
                job: Any = all_raw[raw_left % len(all_raw)]
                raw_left -= 1
            else:
                job = await loop.run_in_executor(None, todo.get)
                if job is None:
                    break
            burst = sent % 1000 < a.burst and sent >= 1000  # the first `burst` of each 1,000
            tasks.add(asyncio.create_task(one(job, burst)))
            sent += 1
            tasks = {x for x in tasks if not x.done()}
            while len(tasks) > a.burst + a.concurrency:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                tasks = {x for x in tasks if not x.done()}
        await asyncio.gather(*tasks)
    return sent


def _still_serves(url: str, deadline: float) -> int | str:
    try:
        body = {"prompt": "hi", "max_tokens": 2}
        return httpx.post(url + "/v1/completions", json=body, timeout=deadline).status_code
    except httpx.HTTPError as e:
        return f"no: {type(e).__name__}"


class _nothing:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--deadline", type=float, default=60.0, help="seconds each request may take")
    p.add_argument("--request-timeout", type=float,
                   help="the server's --request-timeout (default: 80%% of --deadline, so the "
                   "server answers before the client gives up)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--burst", type=int, default=64, help="requests at once, every 1,000")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="default: the embedded default model")
    p.add_argument("--code", type=Path, default=ROOT, help="the tree whose mlxd the server runs")
    p.add_argument("--serve-arg", action="append", default=[], help="one more `mlxd serve` arg")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--json", type=Path, help="write the summary here too")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mlxd-hostile-") as data_dir:
        proc, url = start_server(a, data_dir)
        try:
            before = rss_mb(proc.pid)
            t, start = Tally(), time.perf_counter()
            sent = asyncio.run(fire(a, url, t))
            wall = time.perf_counter() - start
            still = _still_serves(url, a.deadline)
            if proc.poll() is not None:  # it died: how, from its log
                text = (Path(data_dir) / "server.log").read_text()
                start = min((i for i in (text.find("Fatal"), text.find("Traceback")) if i >= 0),
                            default=max(len(text) - 3000, 0))  # fmt: skip
                print(f"the server exited ({proc.returncode}):\n{text[start:start + 3000]}",
                      file=sys.stderr)  # fmt: skip
            after = rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    fives = sum(v for k, v in t.status.items() if k.split()[-1].startswith("5"))
    summary = {"requests": sent, "by_status": dict(sorted(t.status.items())), "5xx": fives,
               "unanswered": len(t.unanswered), "failures": len(t.failures),
               "served_after": still, "rss_mb_before": round(before, 1),
               "rss_mb_after": round(after, 1), "wall_s": round(wall, 1)}  # fmt: skip
    print(json.dumps(summary, indent=1))
    for line in t.failures[:40] + t.unanswered[:20]:
        print("FAIL", line[:600])  # whole in --json
    if a.json:
        a.json.write_text(json.dumps({**summary, "cases": t.failures + t.unanswered}, indent=1))
    return 0 if not (fives or t.unanswered or t.failures) and still == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
