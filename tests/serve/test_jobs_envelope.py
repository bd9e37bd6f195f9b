"""The one job envelope: `/v1/jobs` and its event stream, an exclusive job holding inference
off with 503 + Retry-After, the memory lease from the pool's budget, a job the server stopped
failed as `server_restarted` and resumed by the next server, and `mlxd jobs` on a live server."""

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serve.conftest import LiveServer, start_server

EXAMPLES = "\n".join(
    json.dumps({"messages": [{"role": "user", "content": f"Q{i}"},
                             {"role": "assistant", "content": "Always forty-two."}]})
    for i in range(4)
).encode()  # fmt: skip
CHAT = {"model": "default_model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def upload(live: LiveServer) -> str:
    form = {"files": {"file": ("t.jsonl", EXAMPLES)}, "data": {"purpose": "fine-tune"}}
    r = httpx.post(live.v1 + "/files", **form, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def create(live: LiveServer, file_id: str, priority: str = "background", **hp: object) -> dict:
    hp = {"iters": 5000, "batch_size": 2, "max_seq_length": 64, "save_every": 2, **hp}
    body = {"type": "fine_tune", "model": "default_model", "training_file": file_id,
            "priority": priority, "hyperparameters": hp}  # fmt: skip
    r = httpx.post(live.v1 + "/jobs", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def job(live: LiveServer, job_id: str) -> dict:
    return httpx.get(f"{live.v1}/jobs/{job_id}", timeout=10).json()


def wait(live: LiveServer, job_id: str, ok, timeout: float = 90) -> dict:
    deadline = time.time() + timeout
    while not ok(now := job(live, job_id)):
        assert time.time() < deadline, now
        time.sleep(0.1)
    return now


def training(j: dict) -> bool:
    return j["status"] == "running" and j["progress"] > 0


def ended(j: dict) -> bool:
    return j["status"] in ("succeeded", "failed", "cancelled")


@pytest.fixture
def live(qwen3_model_dir: Path, tmp_path: Path):
    server = start_server(model=str(qwen3_model_dir), data_dir=str(tmp_path / "data"))
    yield server
    server.stop()


def test_an_exclusive_job_holds_inference_off_until_it_ends(live) -> None:
    assert httpx.post(live.v1 + "/chat/completions", json=CHAT, timeout=60).status_code == 200
    j = create(live, upload(live), priority="exclusive")
    wait(live, j["id"], training)
    for path in ("/chat/completions", "/messages", "/completions"):
        r = httpx.post(live.v1 + path, json={**CHAT, "prompt": "x"}, timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "5", (path, r.text)
        assert j["id"] in r.text
    assert httpx.get(live.v1 + "/models", timeout=10).status_code == 200
    httpx.post(f"{live.v1}/jobs/{j['id']}/cancel", params={"force": "true"}, timeout=10)
    assert wait(live, j["id"], ended)["status"] == "cancelled"
    assert httpx.post(live.v1 + "/chat/completions", json=CHAT, timeout=60).status_code == 200


def test_the_event_stream_follows_a_job_to_its_end(live) -> None:
    j = create(live, upload(live), iters=4, save_every=2)
    frames = []
    with httpx.stream("GET", f"{live.v1}/jobs/{j['id']}/events", params={"stream": "true"},
                      timeout=90) as r:  # fmt: skip
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append(line[6:])
    assert frames[-1] == "[DONE]"
    items = [json.loads(f) for f in frames[:-1]]
    progress = [i["progress"] for i in items if i["object"] == "job"]
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert items[-1]["status"] == "succeeded" and items[-1]["output_model"].startswith("ft:")
    events = [i for i in items if i["object"] == "job.event"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["data"]["step"] for e in events if e["type"] == "checkpoint"] == [2, 4]
    page = httpx.get(f"{live.v1}/jobs/{j['id']}/events", params={"after": 2}, timeout=10).json()
    assert [e["seq"] for e in page["data"]] == list(range(3, len(events) + 1))


def test_a_job_beyond_the_memory_budget_fails_and_a_running_one_holds_its_lease(
    qwen3_model_dir: Path, tmp_path: Path
) -> None:
    live = start_server(model=str(qwen3_model_dir), data_dir=str(tmp_path / "data"),
                        memory_budget="2GB")  # fmt: skip
    try:
        file_id = upload(live)
        huge = create(live, file_id, iters=2, max_seq_length=1 << 24)
        failed = wait(live, huge["id"], ended)
        assert failed["status"] == "failed" and failed["error"]["code"] == "insufficient_memory"
        j = create(live, file_id)
        wait(live, j["id"], training)
        pool = live.state.provider.pool
        assert pool.leases == {j["id"]: j["lease_bytes"]} and j["lease_bytes"] > 0
        assert pool.held() == live.state.provider.default.weight_bytes + j["lease_bytes"]
        httpx.post(f"{live.v1}/jobs/{j['id']}/cancel", params={"force": "true"}, timeout=10)
        wait(live, j["id"], ended)
        assert pool.leases == {}
    finally:
        live.stop()


def test_a_job_the_server_stopped_is_failed_and_resumes_on_the_next_server(
    qwen3_model_dir: Path, tmp_path: Path
) -> None:
    data = str(tmp_path / "data")
    first = start_server(model=str(qwen3_model_dir), data_dir=data)
    j = create(first, upload(first))
    wait(first, j["id"], lambda x: training(x) and x["progress"] * 5000 >= 3)
    pid = first.state.jobs._running[j["id"]].pid
    first.stop()
    with pytest.raises(ProcessLookupError):  # the job's process ended with the server
        import os

        os.kill(pid, 0)
    second = start_server(model=str(qwen3_model_dir), data_dir=data)
    try:
        failed = job(second, j["id"])
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_restarted"
        r = httpx.post(f"{second.v1}/jobs/{j['id']}/resume", timeout=10)
        assert r.status_code == 200, r.text
        resumed = second.state.jobs.get(j["id"])
        assert Path(resumed.spec["resume_adapter_file"]).exists()
        assert resumed.spec["iters"] < 5000
        wait(second, j["id"], training)
        httpx.post(f"{second.v1}/jobs/{j['id']}/cancel", params={"force": "true"}, timeout=10)
        wait(second, j["id"], ended)
    finally:
        second.stop()


def test_the_jobs_command_lists_and_follows_a_job(live) -> None:
    j = create(live, upload(live), iters=3, save_every=10)
    cli = [sys.executable, "-m", "mlxd", "jobs", "--url", live.url]
    follow = subprocess.run(
        [*cli, "logs", "-f", j["id"]], capture_output=True, text=True, timeout=120
    )
    assert follow.returncode == 0, follow.stderr
    assert "The job has successfully completed" in follow.stdout
    assert "succeeded" in follow.stderr  # the progress bar's last state
    listed = subprocess.run([*cli, "list"], capture_output=True, text=True, timeout=60)
    row = next(line for line in listed.stdout.splitlines() if j["id"] in line)
    assert "succeeded" in row and "100.0%" in row and "ft:default_model" in row
    bad = subprocess.run([*cli, "cancel", "ftjob-nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "404" in bad.stderr
