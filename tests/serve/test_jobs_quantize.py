"""Quantization jobs over `/v1/jobs`: the output equals `mlx_lm.convert` with the same settings
tensor for tensor, joins the pool under its own name and answers requests at once, and is
listed by `mlxd models`; bad settings are a 400 before anything queues."""

import time
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from mlx_lm.convert import convert
from serve.conftest import start_server

from mlxd.cli.models_scan import local_models


def wait(live, job_id: str, timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while (j := httpx.get(f"{live.v1}/jobs/{job_id}", timeout=10).json())["status"] in (
        "queued",
        "running",
    ):
        assert time.time() < deadline, j
        time.sleep(0.2)
    return j


def tensors(folder: Path) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(mx.load(str(f)))
    return out


def test_a_quantize_job_equals_mlx_lm_convert_and_is_served_at_once(
    qwen3_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    live = start_server(model=str(qwen3_model_dir), data_dir=str(tmp_path / "data"))
    try:
        body = {"type": "quantize", "model": "default_model", "bits": 4, "group_size": 64}
        r = httpx.post(live.v1 + "/jobs", json=body, timeout=30)
        assert r.status_code == 200, r.text
        done = wait(live, r.json()["id"])
        assert done["status"] == "succeeded", done["error"]
        name = done["output_model"]
        folder = Path(done["result"]["model_path"])
        assert folder == tmp_path / "home" / "models" / name
        ref = tmp_path / "ref"
        convert(str(qwen3_model_dir), mlx_path=str(ref), quantize=True, q_bits=4, q_group_size=64)
        got, want = tensors(folder), tensors(ref)
        assert got.keys() == want.keys()
        assert all(mx.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
        assert name in [m["id"] for m in httpx.get(live.v1 + "/models", timeout=10).json()["data"]]
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        answer = httpx.post(live.v1 + "/chat/completions", json=chat, timeout=120)
        assert answer.status_code == 200 and answer.json()["model"] == name, answer.text
        listed = {m.path: m for m in local_models()}
        assert listed[str(folder)].source == "quantized" and listed[str(folder)].format == "4-bit"
    finally:
        live.stop()


@pytest.mark.parametrize(
    "extra, param_or_text",
    [
        ({"bits": 9}, "bits"),
        ({"mode": "int3"}, "mode"),
        ({"recipe": "mixed_3_6", "target_bpw": 4.5}, "target_bpw"),
        ({"calibration": "/etc/passwd"}, "calibration"),
        ({"calibration_file": "file-nope"}, "calibration_file"),
        ({"priority": "soon"}, "priority"),
        ({"type": "convert"}, "type"),
        ({"model": "nope"}, "model"),
    ],
)
def test_bad_quantize_requests_are_refused_before_queueing(
    qwen3_server, extra, param_or_text
) -> None:
    body = {"type": "quantize", "model": "default_model", **extra}
    r = httpx.post(qwen3_server.v1 + "/jobs", json=body, timeout=30)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert param_or_text in (err.get("param") or "") + err["message"]
    assert qwen3_server.state.jobs.jobs() == []
