"""Mixed per-layer KV (`--kv-config`, mlx-optiq's kv_config.json). Oracle: mlx-optiq's
`install_mixed_kv`, run live in a subprocess under its own interpreter (MLXD_OPTIQ_PYTHON, or
/work/optiq-venv/bin/python) through its patched `mlx_lm.server.stream_generate`. optiq is not a
test dependency: it monkeypatches mlx-lm on import of its hooks and pulls pygame, textual, flask
and more, so CI cannot install it. Where it is absent, the same cases run against an op-for-op
transcription of its hook (`_optiq_hook`, from optiq 0.7.7 serve.py and runtime/kv/rotating.py),
installed the way optiq installs it: as mlx_lm.generate.maybe_quantize_kv_cache, with a
non-None kv_bits so generate_step calls it. Exact means exact: token ids and logprob arrays."""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from fixtures.optiq_oracle import OPTIQ_PYTHON, oracle_env
from fixtures.optiq_python import needs_optiq
from fixtures.optiq_reference import optiq_hook as _optiq_hook
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import ArraysCache, QuantizedKVCache, make_prompt_cache

from mlxd.cli.generate import configure, resolve_kv_config
from mlxd.engine.request import GenerationRequest
from mlxd.engine.serial import SerialRow
from mlxd.kv import mixed
from mlxd.kv.schemes import unsupported
from mlxd.model.errors import ModelLoadError

PROMPT = list(range(1000, 1013))  # 13 prompt tokens
N = 12
# arch -> (kv_config, quantized_kv_start, prefill_step_size)
CASES = {
    # every layer, two schemes; converts after the first 4-token prefill chunk
    "qwen3": ([{"layer_idx": 0, "bits": 8, "group_size": 32}, {"layer_idx": 1, "bits": 4}], 0, 4),
    # layer 0 unnamed (stays unquantized); converts mid-decode, at offset 16
    "llama": ([{"layer_idx": 1, "bits": 4, "group_size": 32}], 16, 2048),
    # hybrid: layer 0 is recurrent state (kept), layer 2 attention; converts mid-prefill
    "lfm2": ([{"layer_idx": 0, "bits": 4}, {"layer_idx": 2, "bits": 3, "group_size": 32}], 6, 3),
    # sliding-window layers 0-2 unnamed; the global layer 3 quantized
    "gemma3": ([{"layer_idx": 3, "bits": 6, "group_size": 64}], 0, 5),
}


def _formats(cache: list) -> list:
    return [[type(c).__name__, getattr(c, "bits", None), getattr(c, "group_size", None)]
            for c in cache]  # fmt: skip


def _ours(model, raw: list, start: int, step: int) -> tuple[list, list, list]:
    """SerialRow (mlx-lm's generate_step cut into units) with our quantizer."""
    cache = make_prompt_cache(model)
    req = GenerationRequest(mx.array(PROMPT), max_tokens=N, prompt_cache=cache,
                            prefill_step_size=step, quantized_kv_start=start,
                            kv_config=mixed.parse(raw))  # fmt: skip
    row = SerialRow(model, req, generation_stream)
    while row.prefilling:
        row.prefill_chunk()
    events = list(iter(row.decode, None))
    return [e.token for e in events], [np.array(e.logprobs) for e in events], _formats(cache)


def _reference(model, raw: list, start: int, step: int, monkeypatch) -> tuple[list, list, list]:
    monkeypatch.setattr(sys.modules["mlx_lm.generate"], "maybe_quantize_kv_cache", _optiq_hook(raw))
    cache = make_prompt_cache(model)
    trigger = max(e["bits"] for e in raw)  # optiq's injected kv_bits: any non-None value
    out = list(generate_step(mx.array(PROMPT), model, max_tokens=N, prompt_cache=cache,
                             prefill_step_size=step, kv_bits=trigger, kv_group_size=64,
                             quantized_kv_start=start))  # fmt: skip
    return [int(t) for t, _ in out], [np.array(lp) for _, lp in out], _formats(cache)


def _assert_same(got: tuple, want: tuple) -> None:
    n = len(want[0])  # optiq's stream_generate stops at EOS
    assert n >= 4 and got[0][:n] == want[0]
    assert all(np.array_equal(a, b) for a, b in zip(got[1][:n], want[1], strict=True))
    assert got[2] == want[2]


@pytest.mark.parametrize("arch", list(CASES))
def test_same_bits_as_optiqs_algorithm(tiny_lm, arch: str, monkeypatch) -> None:
    model = tiny_lm(arch)
    raw, start, step = CASES[arch]
    got = _ours(model, raw, start, step)
    assert any(f[0] == "QuantizedKVCache" for f in got[2])  # it converted something
    plain = list(generate_step(mx.array(PROMPT), model, max_tokens=N, prefill_step_size=step))
    assert not np.array_equal(got[1][-1], np.array(plain[-1][1]))  # and that changed the bits
    _assert_same(got, _reference(model, raw, start, step, monkeypatch))


DRIVER = """
import json, sys
import mlx.core as mx, numpy as np
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
from optiq.serve import _load_kv_config, install_mixed_kv
import mlx_lm.server as server
spec = json.loads(sys.argv[1])
for name, case in spec["cases"].items():
    install_mixed_kv(kv_configs=_load_kv_config(case["config"]), quantized_kv_start=case["start"])
    model, tok = load(case["model"])
    cache = make_prompt_cache(model)
    out = list(server.stream_generate(model, tok, mx.array(spec["prompt"]), max_tokens=spec["n"],
                                      prompt_cache=cache, prefill_step_size=case["step"]))
    np.savez(f"{spec['out']}/{name}.npz", *[np.array(r.logprobs) for r in out],
             tokens=np.array([r.token for r in out]))
    formats = [[type(c).__name__, getattr(c, "bits", None), getattr(c, "group_size", None)]
               for c in cache]
    open(f"{spec['out']}/{name}.json", "w").write(json.dumps(formats))
"""


@needs_optiq
def test_same_bits_as_mlx_optiq_live(tiny_lm, tiny_model, tmp_path: Path) -> None:
    cases = {}
    for arch, (raw, start, step) in CASES.items():
        (tmp_path / f"{arch}.kv.json").write_text(json.dumps(raw))
        cases[arch] = {"model": str(tiny_model(arch)), "config": str(tmp_path / f"{arch}.kv.json"),
                       "start": start, "step": step}  # fmt: skip
    spec = {"cases": cases, "prompt": PROMPT, "n": N, "out": str(tmp_path)}
    run = subprocess.run([str(OPTIQ_PYTHON), "-c", DRIVER, json.dumps(spec)], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path, env=oracle_env())  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    for arch, (raw, start, step) in CASES.items():
        saved = np.load(tmp_path / f"{arch}.npz")
        lps = [saved[f"arr_{i}"] for i in range(len(saved.files) - 1)]
        want = (saved["tokens"].tolist(), lps, json.loads((tmp_path / f"{arch}.json").read_text()))
        _assert_same(_ours(tiny_lm(arch), raw, start, step), want)


def test_conversion_timing_and_layers(tiny_lm) -> None:
    """A named layer converts once its offset reaches the start; unnamed and recurrent layers
    keep their format; a converted layer is not converted again."""
    model = tiny_lm("lfm2")
    cfg = mixed.parse([{"layer_idx": 0, "bits": 4}, {"layer_idx": 2, "bits": 8}])
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT[:5]]), cache=cache)
    mixed.convert(cache, cfg, quantized_kv_start=6)
    assert [type(c).__name__ for c in cache] == [type(c).__name__ for c in make_prompt_cache(model)]
    model(mx.array([PROMPT[5:6]]), cache=cache)
    mixed.convert(cache, cfg, quantized_kv_start=6)
    q = cache[2]
    assert isinstance(q, QuantizedKVCache) and (q.bits, q.group_size, q.offset) == (8, 64, 6)
    assert isinstance(cache[0], ArraysCache) and type(cache[1]).__name__ == "ArraysCache"
    mixed.convert(cache, cfg, quantized_kv_start=0)
    assert cache[2] is q


def test_token_bytes_equal_the_converted_caches(tiny_lm) -> None:
    model = tiny_lm("qwen3")
    cfg = mixed.parse(CASES["qwen3"][0][:1])  # layer 0 at 8 bits / 32, layer 1 unquantized
    cache = make_prompt_cache(model)
    model(mx.arange(256)[None], cache=cache)  # one allocation step: no spare capacity
    mixed.convert(cache, cfg)
    mx.eval([c.state for c in cache])
    per_layer, itemsize = mixed.layer_token_bytes(model)
    assert mixed.token_bytes(cfg, per_layer, itemsize) == sum(c.nbytes for c in cache) / 256
    assert mixed.token_bytes(None, per_layer, itemsize) == sum(per_layer)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"layer_idx": 0, "bits": 4}, "must be a JSON list"),
        ([], "names no layers"),
        ([3], "entry 0 must be an object"),
        ([{"bits": 4}], "entry 0 is missing 'layer_idx'"),
        ([{"layer_idx": 0}], "missing 'bits'"),
        ([{"layer_idx": 0, "bits": 4, "group": 64}], r"unknown keys \['group'\]"),
        ([{"layer_idx": 0, "bits": "4"}], "'bits' must be an integer"),
        ([{"layer_idx": 0, "bits": 7}], "bits 7 is not one of"),
        ([{"layer_idx": 0, "bits": 16}], "bits 16 is not one of"),
        ([{"layer_idx": 0, "bits": 4, "group_size": 16}], "group_size 16 is not one of"),
        ([{"layer_idx": -1, "bits": 4}], "negative"),
        ([{"layer_idx": 1, "bits": 4}, {"layer_idx": 1, "bits": 8}], "layer 1 is named twice"),
    ],
)
def test_bad_configs_are_refused(raw, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mixed.parse(raw)


def test_loading_a_file(tmp_path: Path) -> None:
    path = tmp_path / "kv_config.json"
    path.write_text("[{")
    with pytest.raises(ValueError, match="not JSON"):
        mixed.load(path)
    with pytest.raises(ValueError, match="cannot read"):
        mixed.load(tmp_path / "missing.json")
    path.write_text(json.dumps(CASES["qwen3"][0]))
    cfg = mixed.load(str(path))
    assert cfg == mixed.parse(cfg.to_json()) and hash(cfg) == hash(mixed.load(path))
    assert cfg.key == "mixed:0=8/32,1=4/64" and cfg.summary().startswith("2 layers: 1@4-bit")


def test_configs_checked_against_the_model(tiny_lm) -> None:
    with pytest.raises(ValueError, match="layer 2 is out of range: the model has 2"):
        mixed.check(tiny_lm("qwen3"), mixed.parse([{"layer_idx": 2, "bits": 4}]))
    with pytest.raises(ValueError, match="group_size 128 does not divide its keys head dim"):
        mixed.check(tiny_lm("llama"), mixed.parse([{"layer_idx": 0, "bits": 4, "group_size": 128}]))
    gemma = tiny_lm("gemma3")
    mixed.check(gemma, mixed.parse(CASES["gemma3"][0]))  # the global layer only: fine
    rotating = mixed.parse([{"layer_idx": 1, "bits": 4}])
    assert unsupported(gemma, mixed.parse(CASES["gemma3"][0])) is None
    assert unsupported(gemma, rotating) is None  # a quantized ring (the server's, optiq's way)
    recurrent = mixed.parse([{"layer_idx": 0, "bits": 4}])  # lfm2's layer 0: conv state
    why = unsupported(tiny_lm("lfm2"), recurrent) or ""
    assert "kv_config layer 0 (4-bit) cannot apply: the layer is a ArraysCache" in why
    cache = make_prompt_cache(gemma)
    gemma(mx.array([PROMPT]), cache=cache)
    with pytest.raises(NotImplementedError, match="RotatingKVCache Quantization NYI"):
        mixed.convert(cache, rotating)  # the Python API fails as mlx-lm's kv_bits does
    mixed.convert(cache, rotating, windows=True)  # as optiq converts it
    assert type(cache[1]).__name__ == "RotatingQuantizedKVCache" and cache[1].bits == 4


def test_cli_flags(tmp_path: Path) -> None:
    import argparse

    path = tmp_path / "kv.json"
    path.write_text(json.dumps(CASES["llama"][0]))
    parse = configure(argparse.ArgumentParser()).parse_args
    args = parse(["--kv-config", str(path)])
    resolve_kv_config(args)
    assert args.kv_config == mixed.load(path) and args.quantized_kv_start == 0  # optiq's default
    args = parse(["--kv-config", str(path), "--quantized-kv-start", "100"])
    resolve_kv_config(args)
    assert args.quantized_kv_start == 100
    with pytest.raises(ModelLoadError, match="mutually exclusive"):
        resolve_kv_config(parse(["--kv-config", str(path), "--kv-bits", "4"]))
    with pytest.raises(ModelLoadError, match="cannot read"):
        resolve_kv_config(parse(["--kv-config", str(tmp_path / "nope.json")]))
    args = parse([])
    resolve_kv_config(args)
    assert args.kv_config is None and args.quantized_kv_start == 5000
