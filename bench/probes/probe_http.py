"""The HTTP side alone: mlxd's real server (routes, generation, SSE, middleware, uvicorn) on a
paced stand-in engine (paced_engine.py), N streams at once from light raw-socket clients in
this process. Reports the event loop's CPU per frame and the engine's achieved step against the
step it was paced at: the GIL time the loop takes from the engine.

    python -m bench.probes.probe_http --model DIR --streams 32 --tokens 256 --step-ms 10
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mlxd.bench.servers import free_port


def _serve_child(a: argparse.Namespace) -> None:
    """The server process: `mlxd serve`'s state and app, its engine swapped for a paced one."""
    import dataclasses

    import uvicorn

    from bench.probes.paced_engine import PacedEngine
    from mlxd.cli import build_parser
    from mlxd.config import ServeConfig
    from mlxd.engine.overlap import step_phases
    from mlxd.serve.app import build_app
    from mlxd.serve.main import make_state

    if a.switch_interval is not None:
        sys.setswitchinterval(a.switch_interval)
    phases = step_phases("engine") if a.engine_phases else None
    args = build_parser().parse_args(["serve", "--model", a.model, "--port", str(a.port)])
    state = make_state(ServeConfig.from_args(args))
    served = state.provider.default
    tok = served.tokenizer
    ids = tok.encode(" the quick brown fox jumps over a lazy dog and runs far away")
    pieces = [(i, tok.decode([i])) for i in ids]
    engine = PacedEngine(
        pieces, a.step_ms / 1e3, a.gil_ms / 1e3, work=a.work, phases=phases, rest_s=a.rest_ms / 1e3
    )
    served.engine.close()
    state.provider.default = dataclasses.replace(served, engine=engine)

    def report() -> None:
        out = {"engine_tid": engine.native_id, "loop_tid": os.getpid(), "steps": engine.steps,
               "builds": engine.builds}  # fmt: skip
        Path(a.stats).write_text(json.dumps(out))

    engine.on_close = report  # the app's lifespan closes the engines at shutdown
    app = build_app(state)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


def _thread_cpu_s(pid: int) -> dict[int, float]:
    """Each thread's CPU seconds: schedstat's nanoseconds where the kernel keeps them, else
    stat's clock ticks (10 ms each: too coarse for a short run)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        task = f"/proc/{pid}/task/{tid}"
        if os.path.exists(f"{task}/schedstat"):
            with open(f"{task}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
            continue
        with open(f"{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


async def _stream(port: int, body: bytes) -> int:
    """One streamed chat completion over a raw socket; the `data: {` frames it carried."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    frames, tail = 0, b""
    while data := await reader.read(65536):
        data = tail + data
        frames += data.count(b"data: {")
        tail = data[-8:]
        frames -= tail.count(b"data: {")
    writer.close()
    return frames


async def _round(port: int, streams: int, tokens: int) -> int:
    bodies = [
        json.dumps({"messages": [{"role": "user", "content": f"agent {i}: go on"}],
                    "max_tokens": tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}).encode()
        for i in range(streams)
    ]  # fmt: skip
    return sum(await asyncio.gather(*[_stream(port, b) for b in bodies]))


def measure(a: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        stats = Path(tmp) / "stats.json"
        cmd = [sys.executable, "-m", "bench.probes.probe_http", "--serve-child", "--model", a.model,
               "--port", str(port), "--step-ms", str(a.step_ms), "--gil-ms", str(a.gil_ms),
               "--stats", str(stats)]  # fmt: skip
        if a.switch_interval is not None:
            cmd += ["--switch-interval", str(a.switch_interval)]
        cmd += ["--work"] * a.work + ["--engine-phases"] * a.engine_phases
        cmd += ["--rest-ms", str(a.rest_ms)]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        _wait(port, proc)
        asyncio.run(_round(port, a.streams, min(a.tokens, 32)))  # warm-up
        before, t0 = _thread_cpu_s(proc.pid), time.time()
        frames = asyncio.run(_round(port, a.streams, a.tokens))
        wall, after = time.time() - t0, _thread_cpu_s(proc.pid)
        proc.terminate()
        proc.wait(30)
        report = json.loads(stats.read_text())
    loop_s = after[report["loop_tid"]] - before[report["loop_tid"]]
    steps = report["steps"][-(a.tokens - 1) :]  # the measured round's steps
    return {
        "streams": a.streams,
        "frames": frames,
        "wall_s": round(wall, 3),
        "frames_per_s": round(frames / wall, 1),
        "loop_cpu_us_per_frame": round(1e6 * loop_s / frames, 1),
        "loop_busy": round(loop_s / wall, 3),
        "paced_step_ms": a.step_ms,
        "step_p50_ms": round(1e3 * statistics.median(steps), 3),
        "step_mean_ms": round(1e3 * statistics.fmean(steps), 3),
        **(
            {"build_p50_ms": round(1e3 * statistics.median(b), 3)}
            if (b := report["builds"])
            else {}
        ),
    }


def _wait(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a local model folder (its tokenizer is used)")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    p.add_argument("--step-ms", type=float, default=10.0, help="the paced engine's step")
    p.add_argument("--gil-ms", type=float, default=2.3, help="of it, Python work holding the GIL")
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval")
    p.add_argument(
        "--work",
        action="store_true",
        help="the engine's build as fixed Python work (--gil-ms alone), which the loop's frames "
        "stretch, and a fixed device part (--step-ms minus --gil-ms)",
    )
    p.add_argument(
        "--rest-ms",
        type=float,
        default=0.0,
        help="with --work: Python work after each step's tokens, before the next build (the "
        "engine's turn: ~1 ms on an H100)",
    )
    p.add_argument(
        "--engine-phases",
        action="store_true",
        help="--switch-interval engine's intervals and held wake-up",
    )
    p.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--stats", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_child:
        return _serve_child(a)
    print(json.dumps(measure(a)))


if __name__ == "__main__":
    main()
