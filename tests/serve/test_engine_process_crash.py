"""An engine process that dies never takes the server down: its requests end at once with a
502 (a stream: an error frame, then [DONE]), /health says degraded with the reason, requests
meanwhile get a 503 with Retry-After, the engine restarts and serves the next request, the SSD
prefix tier survives, and the server's file descriptors and memory stay flat over 20 crashes."""

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve.conftest import LiveServer, start_server

from mlxd.model import ModelLoadError

SIGNALS = (
    signal.SIGKILL,
    signal.SIGSEGV,
    signal.SIGABRT,
)  # the OOM killer, a native crash, an abort


@pytest.fixture(scope="module")
def live(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    ssd = tmp_path_factory.mktemp("ssd")
    server = start_server(model=str(qwen3_model_dir), isolation="process", ssd_cache=str(ssd),
                          data_dir=str(tmp_path_factory.mktemp("data")))  # fmt: skip
    server.state.provider.default.engine.backoff_s = (0.1,)  # the test's crashes come fast
    yield server
    server.stop()


def engine(live: LiveServer) -> Any:
    return live.state.provider.default.engine


def wait_healthy(live: LiveServer, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if httpx.get(live.url + "/health", timeout=5).status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError("the engine did not come back")


def ask(live: LiveServer, words: int, stream: bool, out: list[Any]) -> None:
    """A chat request whose outcome lands in `out`: ("ok"|"error-frame"|status, body)."""
    body = {"messages": [{"role": "user", "content": "word " * words}], "max_tokens": 48,
            "temperature": 0.0, "ignore_eos": True, "stream": stream}  # fmt: skip
    url = live.v1 + "/chat/completions"
    if not stream:
        r = httpx.post(url, json=body, timeout=60)
        out.append((r.status_code, r.json(), r.headers.get("retry-after")))
        return
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        if r.status_code != 200:
            r.read()
            out.append((r.status_code, r.json(), r.headers.get("retry-after")))
            return
        frames = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]", frames[-3:]
    errors = [json.loads(f)["error"] for f in frames[:-1] if "error" in json.loads(f)]
    out.append(("error-frame", errors[0], None) if errors else ("ok", None, None))


def footprint() -> tuple[int, int]:
    """This process's open file descriptors and resident bytes."""
    fds = len(os.listdir("/proc/self/fd"))
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return fds, rss


def test_twenty_crashes_under_load(live: LiveServer) -> None:
    rng = random.Random(7)
    outcomes: list[Any] = []
    degraded, refused, before = 0, 0, None
    for crash in range(20):
        wait_healthy(live)
        if crash == 5:  # past the first crashes' one-time allocations (threads, sockets)
            before = footprint()
        threads = []
        for i in range(4):  # long prompts (in prefill) and short ones (decoding) at once
            words = rng.choice([4, 40, 400])
            t = threading.Thread(target=ask, args=(live, words, i % 2 == 0, outcomes))
            t.start()
            threads.append(t)
        time.sleep(rng.uniform(0.0, 0.5))  # admission, prefill, decode or a store write
        os.kill(engine(live).proc.pid, SIGNALS[crash % len(SIGNALS)])
        for t in threads:
            t.join(timeout=30)
            assert not t.is_alive(), "a request hung on a dead engine"
        health = httpx.get(live.url + "/health", timeout=5)
        if health.status_code == 503:  # the restart is still under way
            degraded += 1
            reason = health.json()["reasons"][live.state.provider.default.name]
            assert "exited with signal" in reason, reason
            r = httpx.post(live.v1 + "/chat/completions", timeout=30, json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})  # fmt: skip
            if r.status_code == 503:
                refused += 1
                assert r.headers["retry-after"] and r.json()["error"]["type"] == "server_error"
    wait_healthy(live)
    after = footprint()
    assert engine(live).restarts == 20
    kinds = {o[0] for o in outcomes}
    assert kinds <= {"ok", "error-frame", 200, 502, 503}, kinds
    died = [o for o in outcomes if o[0] == 502]
    frames = [o for o in outcomes if o[0] == "error-frame"]
    assert died and frames, kinds  # crashes did land mid-request, on both kinds of reply
    assert all(o[1]["error"]["code"] == "engine_died" for o in died)
    assert all("engine process exited with signal" in o[1]["message"] for o in frames)
    assert degraded >= 10 and refused >= 5, (degraded, refused)
    assert before is not None
    assert after[0] <= before[0] + 2, (before, after)  # descriptors: flat
    assert after[1] < before[1] + (40 << 20), (before, after)  # memory: flat within noise
    r = httpx.post(live.v1 + "/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})  # fmt: skip
    assert r.status_code == 200
    text = httpx.get(live.url + "/metrics").text
    assert 'mlxd_engine_restarts_total{model="' in text and "} 20.0" in text


def test_the_ssd_tier_survives_a_crash(live: LiveServer) -> None:
    wait_healthy(live)
    body = {"messages": [{"role": "user", "content": "persist " * 300}], "max_tokens": 6,
            "temperature": 0.0}  # fmt: skip
    first = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60).json()
    deadline = time.time() + 30
    while time.time() < deadline:  # the disk tier writes behind the reply
        ssd = engine(live).stats_all()["store"]["ssd"]
        if ssd["entries"] and not ssd["pending"]:
            break
        time.sleep(0.1)
    restarts = engine(live).restarts
    os.kill(engine(live).proc.pid, signal.SIGKILL)
    while engine(live).restarts == restarts:
        time.sleep(0.05)
    wait_healthy(live)
    again = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 200  # from the disk
    assert again["choices"] == first["choices"]


def test_a_model_that_cannot_load_is_the_process_error_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ModelLoadError) as e:
        start_server(model=str(folder), isolation="process", data_dir=str(tmp_path / "d"))
    assert "\n" not in str(e.value) and str(folder) in str(e.value)


def engine_children() -> set[int]:
    """This process's living engine processes (the module's other server has one too)."""
    me, pids = os.getpid(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == me and stat[0] != "Z" and b"mlxd.serve.process.child" in cmd:
            pids.add(int(pid))
    return pids


def test_a_restart_that_fails_is_tried_again_one_process_at_a_time(
    qwen3_model_dir: Path, tmp_path: Path
) -> None:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(qwen3_model_dir, folder)
    others = engine_children()

    def ours() -> int:
        return len(engine_children() - others)

    live = start_server(model=str(folder), isolation="process", data_dir=str(tmp_path / "d"))
    try:
        eng = engine(live)
        eng.backoff_s = (0.1,)
        weights = next(folder.glob("*.safetensors"))
        hidden = weights.with_suffix(".hidden")
        weights.rename(hidden)  # every restart now fails to load
        os.kill(eng.proc.pid, signal.SIGKILL)
        while httpx.get(live.url + "/health", timeout=5).status_code == 200:
            time.sleep(0.02)  # until the server has seen the exit (within 0.1 s)
        deadline, seen = time.time() + 8, set()
        while time.time() < deadline:
            assert ours() <= 1  # never two tries at once
            seen.add(httpx.get(live.url + "/health", timeout=5).status_code)
            time.sleep(0.05)
        assert seen == {503} and eng.restarts == 0
        assert "restart failed" in eng.down_reason and "safetensors" in eng.down_reason
        hidden.rename(weights)
        wait_healthy(live)
        assert eng.restarts == 1 and ours() == 1
        r = httpx.post(live.v1 + "/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})  # fmt: skip
        assert r.status_code == 200
    finally:
        live.stop()
    assert ours() == 0
