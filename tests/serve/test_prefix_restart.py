"""The prefix store behind the HTTP API: cached_tokens on every endpoint, and a conversation
prefix of 8k tokens restored from the disk tier by a new server process on the same model."""

from pathlib import Path

import httpx
import pytest

from mlxd.store.ssd import FORMAT_VERSION

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 1200}


def chat(url: str, messages: list[dict], **kw) -> dict:
    body = {"messages": messages, "max_tokens": 8, "logprobs": True, **kw}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def cached(resp: dict) -> int:
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_restart_restores_an_8k_prefix_from_disk(make_server, tmp_path: Path) -> None:
    ssd = str(tmp_path / "ssd")
    first = make_server(ssd_cache=ssd)
    turn1 = [SYSTEM, {"role": "user", "content": "Write a sort function."}]
    reply = chat(first.url, turn1)
    assert reply["usage"]["prompt_tokens"] >= 8000
    turn2 = [*turn1, reply["choices"][0]["message"], {"role": "user", "content": "Now test it."}]
    chat(first.url, turn2)
    again = chat(first.url, turn2)  # the same server, without a restart: served from RAM
    n = again["usage"]["prompt_tokens"]
    assert cached(again) >= n - 1
    first.stop()  # flushes the disk tier's queue

    second = make_server(ssd_cache=ssd)
    restored = chat(second.url, turn2)
    assert cached(restored) >= n - 1
    assert second.state.provider.default.engine.sharing.store.counts["ssd_hits"] == 1
    for key in ("choices", "usage"):
        assert restored[key] == again[key]


def test_a_corrupt_disk_entry_is_never_served(make_server, tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    system = {"role": "system", "content": "You are a careful coding agent. " * 150}
    messages = [system, {"role": "user", "content": "Hello"}]
    first = make_server(ssd_cache=str(ssd))
    clean = chat(first.url, messages)
    first.stop()
    files = [p for p in (ssd / f"v{FORMAT_VERSION}").iterdir() if p.is_file()]
    assert files
    for path in files:  # flip bytes in the middle of every payload
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    second = make_server(ssd_cache=str(ssd))
    resp = chat(second.url, messages)
    assert cached(resp) == 0
    assert resp["choices"] == clean["choices"]
    assert len(list((ssd / "quarantine").iterdir())) >= 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/responses", "/v1/messages"])
def test_every_endpoint_reports_cached_tokens(qwen3_server, path: str) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 40
    if path == "/v1/completions":
        body = {"prompt": prompt, "max_tokens": 4}
    elif path == "/v1/responses":
        body = {"input": prompt, "max_output_tokens": 4}
    else:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
    if path != "/v1/completions":
        body["model"] = "default_model"
    got = []
    for _ in range(2):
        r = httpx.post(qwen3_server.url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        if path == "/v1/completions":
            got.append((u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
        elif path == "/v1/responses":
            got.append((u["input_tokens"], u["input_tokens_details"]["cached_tokens"]))
        else:
            total = u["input_tokens"] + u["cache_read_input_tokens"]
            got.append((total, u["cache_read_input_tokens"]))
    (n, _), (n2, hit) = got
    assert n == n2 and hit == n - 1


def test_sigterm_flushes_the_disk_tier(qwen3_model_dir: Path, tmp_path: Path) -> None:
    """systemd, launchd and docker stop a server with SIGTERM, which uvicorn re-raises after
    its shutdown: the app's lifespan must still close the store (and flush its writes)."""
    import os
    import signal
    import subprocess
    import sys

    from serve.conftest import free_port, wait_healthy

    port = free_port()
    cmd = [sys.executable, "-m", "mlxd", "serve", "--model", str(qwen3_model_dir)]
    cmd += ["--port", str(port), "--ssd-cache", str(tmp_path / "ssd"), "--data-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_healthy(url, proc), "the server did not start"
        chat(url, [{"role": "user", "content": "Hello there"}])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "prefix store closed" in err and "'written': 0" not in err, err[-2000:]
    assert list((tmp_path / "ssd" / f"v{FORMAT_VERSION}").iterdir())


def test_a_kv_budget_also_bounds_the_store(make_server) -> None:
    """Stored caches are KV too: without --prompt-cache-bytes, the KV budget caps the store
    (running rows counted, as mlx_lm.server counts them against --prompt-cache-bytes)."""
    assert make_server().state.provider.default.engine.sharing.store.ram.max_bytes > 1 << 60
    live = make_server(kv_budget=64 << 20)
    assert live.state.provider.default.engine.sharing.store.ram.max_bytes == 64 << 20
    live = make_server(kv_budget=64 << 20, prompt_cache_bytes=8 << 20)
    assert live.state.provider.default.engine.sharing.store.ram.max_bytes == 8 << 20
