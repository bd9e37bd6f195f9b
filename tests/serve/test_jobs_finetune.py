"""Fine-tuning jobs over HTTP, driven by the OpenAI SDK: upload, create, events, checkpoints,
the result served under its `ft:` name with mlx-lm's own bits for that adapter, cancel that
keeps a checkpoint and resume from it, a killed job process, and the bad requests."""

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load, stream_generate
from serve.conftest import LiveServer, start_server

EXAMPLES = [
    {"messages": [{"role": "user", "content": f"Question {i}?"},
                  {"role": "assistant", "content": "The answer is always forty-two."}]}
    for i in range(4)
]  # fmt: skip
MESSAGES = [{"role": "user", "content": "Question 9?"}]
TOKENS = 8


@pytest.fixture(scope="module")
def live(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(model=str(qwen3_model_dir), data_dir=str(tmp_path_factory.mktemp("data")))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.v1, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def training_file(client: openai.OpenAI) -> str:
    data = "\n".join(json.dumps(e) for e in EXAMPLES).encode()
    return client.files.create(file=("train.jsonl", data), purpose="fine-tune").id


def wait(
    client: openai.OpenAI, job_id: str, until: tuple[str, ...], timeout: float = 120
) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in until:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {job.status}")


def chat_ids(live: LiveServer, model: str) -> tuple[list[int], list[float]]:
    body = {"model": model, "messages": MESSAGES, "max_tokens": TOKENS, "logprobs": True,
            "temperature": 0.0}  # fmt: skip
    r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    return [c["id"] for c in content], [c["logprob"] for c in content]


def mlx_lm_ids(model_dir: Path, adapter: str) -> tuple[list[int], list[float]]:
    """mlx-lm's `generate --adapter-path` for the same chat: greedy ids and their logprobs."""
    model, tok = load(str(model_dir), adapter_path=adapter)
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    ids, lps = [], []
    for r in stream_generate(model, tok, mx.array(prompt), max_tokens=TOKENS):
        ids.append(r.token)
        lps.append(r.logprobs[r.token].item())
    return ids, lps


def test_the_sdk_runs_a_job_whose_adapter_is_served_with_mlx_lms_bits(
    live, client, training_file, qwen3_model_dir
) -> None:
    hp = {"n_epochs": 1, "batch_size": 2, "learning_rate": 1e-2, "save_every": 1,
          "max_seq_length": 64}  # fmt: skip
    job = client.fine_tuning.jobs.create(
        model="default_model", training_file=training_file, suffix="answers", seed=3,
        method={"type": "supervised", "supervised": {"hyperparameters": hp}},
    )  # fmt: skip
    assert job.status == "queued" and job.fine_tuned_model is None
    done = wait(client, job.id, ("succeeded", "failed", "cancelled"))
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:default_model:answers:{job.id.removeprefix('ftjob-')}"
    assert done.trained_tokens and done.trained_tokens > 0
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    assert events[0].message == "The job has successfully completed"  # newest first
    assert any(e.type == "metrics" and "train_loss" in (e.data or {}) for e in events)
    ckpts = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    assert [c.step_number for c in ckpts] == [2, 1]
    assert [m.id for m in client.models.list()].count(done.fine_tuned_model) == 1
    adapter = live.state.jobs.get(job.id).result["adapter_path"]
    served = chat_ids(live, done.fine_tuned_model)
    assert served == mlx_lm_ids(qwen3_model_dir, adapter)
    assert served != chat_ids(live, "default_model")  # the adapter changed the answer
    listed = httpx.get(live.v1 + "/jobs", timeout=10).json()["data"]
    assert {"id": job.id, "progress": 1.0, "status": "succeeded"}.items() <= next(
        j for j in listed if j["id"] == job.id
    ).items()


def long_job(client: openai.OpenAI, training_file: str, **extra: object) -> str:
    hp = {"iters": 5000, "batch_size": 2, "max_seq_length": 64, "save_every": 2, **extra}
    return client.fine_tuning.jobs.create(
        model="default_model", training_file=training_file,
        method={"type": "supervised", "supervised": {"hyperparameters": hp}},
    ).id  # fmt: skip


def wait_progress(live: LiveServer, job_id: str, step_fraction: float = 0.0) -> None:
    deadline = time.time() + 60
    while live.state.jobs.get(job_id).progress <= step_fraction:
        assert time.time() < deadline, live.state.jobs.get(job_id)
        time.sleep(0.05)


def test_cancel_keeps_the_last_step_and_resume_runs_on_from_it(live, client, training_file) -> None:
    job_id = long_job(client, training_file)
    wait_progress(live, job_id, 2 / 5000)
    client.fine_tuning.jobs.cancel(job_id)
    cancelled = wait(client, job_id, ("cancelled", "failed", "succeeded"))
    assert cancelled.status == "cancelled"
    ckpts = list(client.fine_tuning.jobs.checkpoints.list(job_id))
    step = ckpts[0].step_number
    assert 2 <= step < 5000
    path = Path(live.state.jobs.events(job_id)[-2]["data"]["path"])
    assert path.exists() and path.name == "adapters.safetensors"
    client.fine_tuning.jobs.resume(job_id)
    job = live.state.jobs.get(job_id)
    assert job.spec["resume_adapter_file"] == str(path) and job.spec["iters"] == 5000 - step
    wait_progress(live, job_id)
    client.fine_tuning.jobs.cancel(job_id)
    assert wait(client, job_id, ("cancelled", "failed")).status == "cancelled"


def test_a_killed_job_process_fails_the_job_and_the_server_serves_on(
    live, client, training_file
) -> None:
    job_id = long_job(client, training_file)
    wait_progress(live, job_id)
    os.kill(live.state.jobs._running[job_id].pid, signal.SIGKILL)
    failed = wait(client, job_id, ("failed", "cancelled", "succeeded"))
    assert failed.status == "failed" and failed.error.code == "process_died"
    assert "-9" in failed.error.message
    assert len(chat_ids(live, "default_model")[0]) == TOKENS


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "nope", "training_file": "FILE"}, 404, "model"),
        ({"model": "default_model", "training_file": "file-missing"}, 400, "training_file"),
        ({"hyperparameters": {"n_epochs": 0}}, 400, "hyperparameters"),
        ({"hyperparameters": {"warp": 9}}, 400, "hyperparameters"),
        ({"hyperparameters": {"model": "/etc"}}, 400, "hyperparameters"),
        ({"hyperparameters": {"resume_adapter_file": "/etc/passwd"}}, 400, "hyperparameters"),
        ({"method": {"type": "dpo"}}, 400, "method"),
        ({"suffix": "a b"}, 400, "suffix"),
        ({"priority": "now"}, 400, "priority"),
        ({"extra": 1}, 400, "extra"),
    ],
)  # fmt: skip
def test_bad_job_requests_are_answered_in_openais_shape(
    live, training_file, body, status, param
) -> None:
    body = {"model": "default_model", "training_file": training_file, **body}
    body = {k: training_file if v == "FILE" else v for k, v in body.items()}
    r = httpx.post(live.v1 + "/fine_tuning/jobs", json=body, timeout=10)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    "data, purpose, message",
    [
        (b'{"text": "x"}\n{oops', "fine-tune", "line 2 is not JSON"),
        (b'{"text": "a"}\n{"prompt": "p", "completion": "c"}', "fine-tune", "line 2 is in another"),
        (b'{"other": 1}', "fine-tune", "line 1 has none of"),
        (b"", "fine-tune", "no examples"),
        (b'{"text": "a"}', "assistants", "purpose must be"),
    ],
)  # fmt: skip
def test_bad_uploads_name_the_line(live, data, purpose, message) -> None:
    r = httpx.post(
        live.v1 + "/files", files={"file": ("t.jsonl", data)}, data={"purpose": purpose}, timeout=10
    )
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_files_list_retrieve_content_and_delete(client) -> None:
    made = client.files.create(file=("x.jsonl", b'{"text": "hello"}\n'), purpose="fine-tune")
    assert client.files.retrieve(made.id).bytes == 18
    assert client.files.content(made.id).read() == b'{"text": "hello"}\n'
    assert made.id in [f.id for f in client.files.list(purpose="fine-tune")]
    assert client.files.delete(made.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
