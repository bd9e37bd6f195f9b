"""MLX model → GGUF (llama.cpp layout) → convert_gguf → MLX model gives the same model back."""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from gguf_writer import random_kquant, random_weights, save_mlx_folder, tiny_config, write_gguf
from mlx.utils import tree_flatten
from mlx_lm.utils import load

import mlxd.model.gguf.convert as convert_mod
import mlxd.model.gguf.weights as weights_mod
from mlxd.model.gguf import convert_gguf
from mlxd.model.gguf.reader import read_gguf

MODEL_TYPES = ["llama", "qwen2", "qwen3", "gemma3_text"]
PROMPT = mx.array([[1, 72, 5, 200, 260, 267, 3, 100, 101, 102, 103, 104]])  # 12 > sliding window
TEXT = "hello world, hello<|im_end|>"


def _params(model) -> dict[str, mx.array]:
    return dict(tree_flatten(model.parameters()))


def _build(
    tmp_path: Path, model_type: str, config_extra: dict | None = None, **gguf_kwargs
) -> tuple[Path, Path, dict]:
    config = tiny_config(model_type) | (config_extra or {})
    weights = random_weights(config, seed=len(model_type))
    raw = gguf_kwargs.pop("raw", {})
    for name, (blocks, qtype) in raw.items():  # the reference holds the K-quant's exact floats
        weights[name] = dequantize(blocks, qtype).reshape(weights[name].shape)
    original = save_mlx_folder(tmp_path / "original", config, weights)
    path = write_gguf(tmp_path / "tiny.gguf", config, weights, raw=raw, **gguf_kwargs)
    return original, path, weights


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_float_and_kquant_roundtrip_is_exact(tmp_path: Path, model_type: str) -> None:
    """F32 tensors plus one Q4_K and one Q6_K ffn_down: logits must be bit-identical."""
    rows = tiny_config(model_type)["hidden_size"]
    raw = {
        "model.layers.0.mlp.down_proj.weight": (random_kquant(rows, 256, Q.Q4_K, 1), Q.Q4_K),
        "model.layers.1.mlp.down_proj.weight": (random_kquant(rows, 256, Q.Q6_K, 2), Q.Q6_K),
    }
    original, path, _ = _build(tmp_path, model_type, raw=raw)
    out = convert_gguf(path, out=tmp_path / "converted", dtype="float32")

    ref_model, ref_tok = load(str(original))
    model, tok = load(str(out))
    assert mx.array_equal(ref_model(PROMPT), model(PROMPT)).item()
    params = _params(model)
    for name, (blocks, qtype) in raw.items():  # K-quants dequantize exactly as gguf-py does
        expected = dequantize(blocks, qtype)
        np.testing.assert_array_equal(np.array(params[name]), expected)
    assert tok.encode(TEXT) == ref_tok.encode(TEXT)
    assert 2 in tok.eos_token_ids and tok.chat_template
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] == (model_type != "qwen3")
    assert "quantization" not in config


def test_llama3_rope_freqs_and_shards(tmp_path: Path, monkeypatch) -> None:
    """Llama 3.x GGUFs carry rope scaling as a `rope_freqs` tensor: recovered into config; and
    a model larger than the shard size is written as several loadable safetensors files."""
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    original, path, _ = _build(
        tmp_path, "llama", config_extra={"rope_theta": 500000.0, "rope_scaling": rope}
    )
    monkeypatch.setattr(weights_mod, "SHARD_BYTES", 100_000)
    out = convert_gguf(path, out=tmp_path / "converted", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] == rope
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert (out / "model.safetensors.index.json").exists()
    ref_model, _ = load(str(original))
    model, _ = load(str(out))
    assert mx.array_equal(ref_model(PROMPT), model(PROMPT)).item()


QUANTIZED = {
    "model.embed_tokens.weight": Q.Q8_0,
    "model.layers.0.self_attn.q_proj.weight": Q.Q4_0,  # permuted rows for llama
    "model.layers.0.self_attn.k_proj.weight": Q.Q4_1,
    "model.layers.1.self_attn.k_proj.weight": Q.Q8_0,
    "model.layers.1.mlp.up_proj.weight": Q.Q4_1,
    "model.layers.1.mlp.down_proj.weight": Q.F16,  # half-precision files: plain floats
    "model.layers.1.self_attn.v_proj.weight": Q.BF16,
}


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_q4_q8_stay_packed_and_exact(tmp_path: Path, model_type: str) -> None:
    """Q4_0/Q4_1/Q8_0 become MLX affine triples whose dequant equals gguf-py's, bit for bit."""
    original, path, weights = _build(tmp_path, model_type, qtypes=QUANTIZED)
    out = convert_gguf(path, out=tmp_path / "converted", dtype="float32")
    model, _ = load(str(out))
    params = _params(model)
    for name, qtype in QUANTIZED.items():
        # Row-wise quantization commutes with llama.cpp's row permutation, so the reference
        # is simply the HF-layout weight quantized and dequantized by gguf-py.
        expected = dequantize(quantize(weights[name], qtype), qtype)
        if qtype in (Q.F16, Q.BF16):
            np.testing.assert_array_equal(np.array(params[name]), expected, err_msg=name)
            continue
        module = name.removesuffix(".weight")
        bits = 8 if qtype == Q.Q8_0 else 4
        deq = mx.dequantize(
            params[f"{module}.weight"],
            params[f"{module}.scales"],
            params[f"{module}.biases"],
            group_size=32,
            bits=bits,
        )
        np.testing.assert_array_equal(np.array(deq), expected, err_msg=name)
    quant = json.loads((out / "config.json").read_text())["quantization"]
    assert quant["group_size"] == 32
    # The other width is listed per module, so any mlx-lm quantizes each module right.
    assert any(isinstance(v, dict) and v["bits"] != quant["bits"] for v in quant.values())
    ref_model, _ = load(str(original))
    logits, ref = model(PROMPT), ref_model(PROMPT)
    assert logits.shape == ref.shape and mx.all(mx.isfinite(logits)).item()


def test_cache_reuses_folder_under_mlxd_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    _, path, _ = _build(tmp_path, "llama")
    out = convert_gguf(path)
    assert out.parent == tmp_path / "home" / "models"
    assert out.name.startswith("tiny-") and out.name.endswith("-float32")  # CPU default
    weights_file = out / "model.safetensors"
    stat = weights_file.stat()

    def boom(*args, **kwargs):
        raise AssertionError("a cached conversion must not be redone")

    monkeypatch.setattr(convert_mod, "write_model", boom)
    assert convert_gguf(path) == out
    assert weights_file.stat().st_mtime_ns == stat.st_mtime_ns
    monkeypatch.setattr(convert_mod, "write_model", weights_mod.write_model)
    assert convert_gguf(path, force=True) == out  # force: converted again, swapped in whole
    assert weights_file.stat().st_ino != stat.st_ino
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temp folders left


def test_interrupted_conversion_leaves_no_folder(tmp_path: Path, monkeypatch) -> None:
    _, path, _ = _build(tmp_path, "qwen3")
    calls = []

    def fail_midway(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return weights_mod.convert_tensor(*args, **kwargs)

    monkeypatch.setattr(weights_mod, "convert_tensor", fail_midway)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(path, out=tmp_path / "out" / "model")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.slow
def test_real_gemma3_k_quants(gemma3_gguf: Path, tmp_path: Path) -> None:
    """A real llama.cpp Q4_K_M Gemma 3: K-quants and Q5_0 dequantized exactly, norms
    un-offset, Q8_0 embedding kept packed, and the model talks sense."""
    from mlx_lm import generate

    out = convert_gguf(gemma3_gguf, out=tmp_path / "gemma", dtype="float32")
    model, tok = load(str(out))
    params, gf = _params(model), read_gguf(gemma3_gguf)
    checks = {
        "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",  # Q4_K
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",  # Q6_K
        "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",  # Q5_0
    }
    for gguf_name, name in checks.items():
        info = gf.tensors[gguf_name]
        expected = dequantize(np.asarray(gf.raw(info)), Q(info.ggml_type))
        np.testing.assert_array_equal(np.array(params[name]), expected, err_msg=gguf_name)
    info = gf.tensors["blk.0.attn_q_norm.weight"]
    stored = np.asarray(gf.raw(info)).view(np.float32)
    np.testing.assert_array_equal(
        np.array(params["model.layers.0.self_attn.q_norm.weight"]), stored - 1
    )
    assert params["model.embed_tokens.weight"].dtype == mx.uint32  # Q8_0 stays packed
    text = generate(model, tok, "The Eiffel Tower is located in the city of", max_tokens=4)
    assert "Paris" in text
