"""The two servers of `mlxd bench serve` as subprocesses on free ports: start, wait on /health
and a warm-up reply, sample the resident memory of the process tree, stop."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

import mlxd
from mlxd.blas import same_blas
from mlxd.config import child_environment

from .variants import kind, label


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(
    side: str,
    model: str,
    port: int,
    batch: int,
    extra: list[str],
    data: Path,
    cache_limit: int | None = None,
) -> list:
    """The server's command line; extra flags come last so that they win. `cache_limit`: MLX's
    buffer cache capped at that many bytes in the server's process (bench/capped.py)."""
    if kind(side) == "mlxd":
        head = ["mlxd", "serve", "--batch", str(batch), "--data-dir", str(data)]
    else:
        head = ["mlx_lm", "server"]
    run = ["-m"] if cache_limit is None else ["-m", "mlxd.bench.capped", str(cache_limit)]
    return [sys.executable, *run, *head, "--model", model, "--port", str(port), *extra]


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def _proc_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its descendants: /proc on Linux, `ps` elsewhere (macOS)."""
    if Path("/proc/self/status").exists():
        todo, total = [pid], 0
        while todo:
            p = todo.pop()
            total += _proc_kb(p, "VmRSS")
            todo += _children(p)
        return total * 1024
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,rss="], capture_output=True, text=True)
    rows = [tuple(int(x) for x in line.split()) for line in out.stdout.splitlines() if line]
    tree, grew = {pid}, True
    while grew:
        before = len(tree)
        tree |= {p for p, pp, _ in rows if pp in tree}
        grew = len(tree) > before
    return 1024 * sum(rss for p, _, rss in rows if p in tree)


def lifetime_peak_rss_bytes(pid: int) -> int | None:
    """The kernel's high-water mark of the main process's RSS (Linux only; None elsewhere)."""
    kb = _proc_kb(pid, "VmHWM")
    return kb * 1024 if kb else None


class RSSSampler(threading.Thread):
    """Samples the tree's RSS every `interval` seconds; `reset()` starts a new peak window."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.current = self.peak = tree_rss_bytes(pid)
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.current = tree_rss_bytes(self.pid)
            self.peak = max(self.peak, self.current)

    def reset(self) -> None:
        self.current = self.peak = tree_rss_bytes(self.pid)

    def stop(self) -> None:
        self._stop.set()


class Server:
    """One server subprocess, its log in `log_dir/<side>.log`."""

    def __init__(self, side: str, cmd: list[str], port: int, log_dir: Path) -> None:
        self.side, self.cmd, self.port = side, cmd, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_dir / f"{side}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # The mlxd being benchmarked is the one imported here, installed or not; both servers
        # multiply on this process's BLAS (MLXD_BLAS=auto: a stock mlx_lm.server preloads it).
        env = same_blas(child_environment(str(Path(mlxd.__file__).resolve().parent.parent)))
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{label(self.side)} server exited with code {self.proc.returncode}:\n"
                + self.log_tail()
            )

    def wait_ready(self, timeout_s: float) -> float:
        """Poll /health, then send one short untimed request: mlx_lm.server answers /health
        while its generation thread is still loading the model. Returns seconds to ready."""
        t0 = time.perf_counter()
        with httpx.Client(base_url=self.url, timeout=timeout_s) as client:
            while True:
                self._check_alive()
                if time.perf_counter() - t0 > timeout_s:
                    raise RuntimeError(f"{label(self.side)}: not healthy after {timeout_s} s")
                try:
                    if client.get("/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            body = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
            r = client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{label(self.side)} warm-up: HTTP {r.status_code}: {r.text}")
        return time.perf_counter() - t0

    def metrics(self) -> dict[str, float] | None:
        """The memory and KV gauges and latency sums of the server's /metrics (mlxd has one,
        mlx_lm.server not): they see what the RSS may not (e.g. KV reserved on a GPU), and where
        a first token's wait went (queue, prefill); None without /metrics."""
        try:
            r = httpx.get(self.url + "/metrics", timeout=10)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        out: dict[str, float] = {}
        for line in r.text.splitlines():
            keep = ("memory", "kv_", "_seconds_sum", "_seconds_count")  # gauges, latency totals
            if line[:1] not in ("", "#") and any(k in line for k in keep):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self._log().splitlines()[-n:])

    def first_traceback(self) -> str:
        return first_traceback(self._log())

    def exit_code(self) -> int | None:
        """The process's exit status once it has ended (negative: the signal that ended it),
        None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def first_traceback(log: str) -> str:
    """The log's first Python traceback through its exception line: the cause, where a dying
    server's later lines only repeat its effect ("generation thread died"). After
    a native crash, faulthandler's dump of every thread's stack follows it (`fatal_error`)."""
    lines = log.splitlines()
    found = [part for part in (_python_traceback(lines), fatal_error(lines)) if part]
    return "\n\n".join(found)


def _python_traceback(lines: list[str]) -> str:
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback (most")), None)
    if start is None:
        return ""
    for end in range(start + 1, len(lines)):
        if lines[end] and not lines[end][0].isspace():
            return "\n".join(lines[start : end + 1])
    return "\n".join(lines[start:])


def fatal_error(lines: list[str], most: int = 200) -> str:
    """faulthandler's report of a native crash ("Fatal Python error: ..." and each thread's
    stack, up to its first blank line after a stack), at most `most` lines; "" without one."""
    start = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    if start is None:
        return ""
    end, seen_stack = start + 1, False
    while end < len(lines) and end - start < most:
        if lines[end].startswith(("Thread 0x", "Current thread 0x")):
            seen_stack = True
        elif seen_stack and not lines[end].strip() and not _more_threads(lines, end + 1):
            break
        end += 1
    return "\n".join(lines[start:end])


def _more_threads(lines: list[str], i: int) -> bool:
    return i < len(lines) and lines[i].startswith(("Thread 0x", "Current thread 0x"))
