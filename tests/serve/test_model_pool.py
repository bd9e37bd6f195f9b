"""A pool of models in one server: two tiny random models (qwen3 and llama, both on the qwen3
tokenizer) served together answer each by its name, alias or path exactly as a server of that
model alone does (token ids and logprobs equal); a model loads on its first request (one load
for concurrent first requests), unloads after its TTL, or under --memory-budget for another
(least recently used first, the pinned default staying); /v1/models shows each one's state,
/v1/models/load and /unload load and unload, /metrics counts them."""

import json
import logging
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest
from serve.conftest import LiveServer, server_args, start_server

from mlxd.engine import GenerationRequest

MESSAGES = [{"role": "user", "content": "Name a colour."}]
HEADROOM = 256 << 20  # budget.py's working memory at a budget under 4 GiB


@pytest.fixture(scope="module")
def dirs(tiny_model) -> dict[str, Path]:
    return {
        "qwen": tiny_model("qwen3"),
        "llama": tiny_model("llama"),
        "qwen_b": tiny_model("qwen3", 1),
    }


def weight_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


@pytest.fixture(scope="module")
def pool(dirs, tmp_path_factory) -> Iterator[LiveServer]:
    """qwen (pinned, the default) and llama (aliases, a default max_tokens) from a models file."""
    tmp = tmp_path_factory.mktemp("pool")
    entries = [
        {"name": "qwen", "path": str(dirs["qwen"]), "aliases": ["q"], "pinned": True},
        {"name": "llama", "path": str(dirs["llama"]), "aliases": ["l", "tiny-llama"],
         "defaults": {"max_tokens": 3}},
    ]  # fmt: skip
    (tmp / "models.json").write_text(json.dumps(entries))
    live = start_server(model=None, models_file=str(tmp / "models.json"), strict_model_names=True,
                        data_dir=str(tmp / "data"))  # fmt: skip
    yield live
    live.stop()


@pytest.fixture(scope="module")
def alone(dirs, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The references: each model's answer from a server of that model alone."""
    out = {}
    for key in ("qwen", "llama"):
        live = start_server(model=str(dirs[key]), data_dir=str(tmp_path_factory.mktemp(key)))
        try:
            out[key] = chat(live, str(dirs[key]))
        finally:
            live.stop()
    return out


def chat(live: LiveServer, model: str, max_tokens: int | None = 8) -> tuple[list, list, str]:
    body: dict[str, Any] = {"model": model, "messages": MESSAGES, "logprobs": True,
                            "temperature": 0.0}  # fmt: skip
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    return [c["id"] for c in content], [c["logprob"] for c in content], choice["finish_reason"]


def models(live: LiveServer) -> dict[str, dict]:
    r = httpx.get(live.v1 + "/models", timeout=30)
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


def post(live: LiveServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(live.v1 + path, json=body, timeout=60)


def metric(live: LiveServer, name: str, **labels: str) -> float | None:
    text = httpx.get(live.url + "/metrics", timeout=30).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return None


def wait_for(check: Any, timeout: float = 15) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_each_name_gets_its_models_answer_and_the_second_loads_on_first_use(
    pool, alone, dirs, caplog
) -> None:
    listed = models(pool)
    assert listed["qwen"]["state"] == "loaded" and listed["qwen"]["pinned"] is True
    assert listed["llama"]["state"] == "unloaded" and listed["llama"]["pinned"] is False
    assert listed["llama"]["size_bytes"] == weight_bytes(dirs["llama"])
    assert listed["llama"]["aliases"] == ["l", "tiny-llama"]
    with caplog.at_level(logging.INFO, logger="mlxd.serve"):
        with ThreadPoolExecutor(2) as ex:  # two first requests: one load
            answers = list(ex.map(lambda name: chat(pool, name), ["llama", "tiny-llama"]))
    loads = [r for r in caplog.records if r.getMessage().startswith("model llama loaded")]
    assert len(loads) == 1, [r.getMessage() for r in loads]
    ids, logprobs, _ = alone["llama"]
    assert ids != alone["qwen"][0]  # two models, two answers
    for got in answers + [chat(pool, "l"), chat(pool, str(dirs["llama"]))]:
        assert got[0] == ids and mx.array_equal(mx.array(got[1]), mx.array(logprobs))
    for name in ("qwen", "q", "default_model", str(dirs["qwen"])):
        got = chat(pool, name)
        assert got[0] == alone["qwen"][0], name
        assert mx.array_equal(mx.array(got[1]), mx.array(alone["qwen"][1])), name
    assert models(pool)["llama"]["state"] == "loaded"
    assert metric(pool, "mlxd_model_loaded", model="llama") == 1


def test_a_models_file_default_applies_when_the_request_leaves_it_out(pool) -> None:
    ids, _, finish = chat(pool, "llama", max_tokens=None)
    assert (len(ids), finish) == (3, "length")
    assert len(chat(pool, "llama", max_tokens=5)[0]) == 5  # the request's own value wins


@pytest.mark.parametrize("name", ["gpt-4o", "nobody/nothing", "/etc"])
def test_an_unknown_model_is_a_404(pool, name) -> None:
    body = {"model": name, "messages": MESSAGES, "max_tokens": 2}
    r = httpx.post(pool.v1 + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("name", ["x\u0000y", 7])
def test_a_malformed_model_is_a_400(pool, name) -> None:
    body = {"model": name, "messages": MESSAGES, "max_tokens": 2}
    r = httpx.post(pool.v1 + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text


def test_load_and_unload_endpoints(pool, alone) -> None:
    assert post(pool, "/models/load", {"model": "l"}).json() == {"success": True}
    ok = post(pool, "/models/unload", {"model": "llama"})
    assert (ok.status_code, ok.json()) == (200, {"success": True})
    assert models(pool)["llama"]["state"] == "unloaded"
    assert metric(pool, "mlxd_model_loaded", model="llama") == 0
    assert metric(pool, "mlxd_model_unloads_total", model="llama", reason="request") == 1
    for body, status in (({"model": "nothing"}, 404), ({"model": "qwen"}, 400), ({}, 400)):
        r = post(pool, "/models/unload", body)
        assert r.status_code == status and r.json()["error"]["param"] == "model", (body, r.text)
    assert post(pool, "/models/load", {"model": "nothing"}).status_code == 404
    # llama.cpp's path without /v1 too; the load answers once the model is loaded
    r = httpx.post(pool.url + "/models/load", json={"model": "llama"}, timeout=60)
    assert r.status_code == 200 and models(pool)["llama"]["state"] == "loaded", r.text
    engine = pool.state.provider.pool.find("llama").served.engine
    held = engine.submit(GenerationRequest(prompt=mx.array([5, 17, 301, 42]), max_tokens=30000))
    next(iter(held))  # admitted and decoding
    try:
        r = post(pool, "/models/unload", {"model": "llama"})
        assert r.status_code == 409 and r.headers["retry-after"], r.text
    finally:
        held.cancel()
        held.wait()
    assert wait_for(lambda: post(pool, "/models/unload", {"model": "llama"}).status_code == 200)
    assert chat(pool, "llama")[0] == alone["llama"][0]  # loads again on use


def test_an_idle_model_unloads_after_its_ttl(dirs, tmp_path) -> None:
    live = start_server(model=str(dirs["qwen"]), models=[str(dirs["llama"])], model_ttl=1.0,
                        data_dir=str(tmp_path / "data"))  # fmt: skip
    try:
        llama = str(dirs["llama"])
        chat(live, llama, max_tokens=2)
        assert models(live)[llama]["state"] == "loaded"
        assert wait_for(lambda: models(live)[llama]["state"] == "unloaded")
        assert metric(live, "mlxd_model_unloads_total", model=llama, reason="ttl") == 1
        time.sleep(1.5)
        assert models(live)[str(dirs["qwen"])]["state"] == "loaded"  # the default stays
    finally:
        live.stop()


def test_the_budget_unloads_the_least_recently_used_model(dirs, tmp_path) -> None:
    """Room for the pinned default and one more: a third model unloads the idle other."""
    q, qb, ll = (weight_bytes(dirs[k]) for k in ("qwen", "qwen_b", "llama"))
    budget = HEADROOM + q + max(qb, ll) + (min(qb, ll) // 2)
    names = [str(dirs["llama"]), str(dirs["qwen_b"])]
    live = start_server(model=str(dirs["qwen"]), models=names, memory_budget=str(budget),
                        data_dir=str(tmp_path / "data"))  # fmt: skip
    try:
        chat(live, names[0], max_tokens=2)
        chat(live, names[1], max_tokens=2)  # llama makes room
        states = {k: v["state"] for k, v in models(live).items()}
        assert states[names[0]] == "unloaded" and states[names[1]] == "loaded", states
        assert states[str(dirs["qwen"])] == "loaded"
        assert metric(live, "mlxd_model_unloads_total", model=names[0], reason="budget") == 1
        chat(live, names[0], max_tokens=2)
        assert models(live)[names[1]]["state"] == "unloaded"
    finally:
        live.stop()


def test_a_model_that_can_never_fit_is_a_400(dirs, tmp_path) -> None:
    q, ll = weight_bytes(dirs["qwen"]), weight_bytes(dirs["llama"])
    budget = HEADROOM + q + ll // 2
    live = start_server(model=str(dirs["qwen"]), models=[str(dirs["llama"])],
                        memory_budget=str(budget), data_dir=str(tmp_path / "data"))  # fmt: skip
    try:
        body = {"model": str(dirs["llama"]), "messages": MESSAGES, "max_tokens": 2}
        r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_too_large", r.text
    finally:
        live.stop()


def test_the_models_flags_make_the_pool_the_default_first(tmp_path) -> None:
    from mlxd.cli.serve import parse_config
    from mlxd.serve.pool_specs import specs_from

    (tmp_path / "m.json").write_text(json.dumps([{"name": "c", "path": "/c", "ttl": 5}]))
    config = parse_config(["--model", "a", "--model", "b", "--models", "auto", "--model", "a",
                           "--models-file", str(tmp_path / "m.json")])  # fmt: skip
    specs = specs_from(config, scan=lambda: ["s1", "b"])
    assert [(s.name, s.path, s.pinned, s.ttl) for s in specs] == [
        ("a", "a", True, None), ("b", "b", False, None), ("s1", "s1", False, None),
        ("c", "/c", False, 5),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "entries, why",
    [
        ([{"path": "/x"}], "non-empty `name`"),
        ([{"name": "x", "ttl": 0}], "`ttl` is a positive number"),
        ([{"name": "x", "defaults": {"model": "y"}}], "not ['model']"),
        ([{"name": "x", "color": 1}], "unknown keys ['color']"),
        ([{"name": "x"}, {"name": "y", "aliases": ["x"]}], "'x' is given twice"),
    ],
)
def test_a_bad_models_file_stops_start_up_naming_it(tmp_path, entries, why) -> None:
    from mlxd.model import ModelLoadError
    from mlxd.serve.pool_specs import specs_from

    path = tmp_path / "models.json"
    path.write_text(json.dumps(entries))
    with pytest.raises(ModelLoadError, match=re.escape(why)):
        specs_from(server_args(model=None, models_file=str(path)))
