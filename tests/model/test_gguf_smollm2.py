"""The real default model: SmolLM2-135M-Instruct's llama.cpp GGUF, converted and run."""

import json
from pathlib import Path

import pytest

from mlxd.model.gguf import convert_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """Converted afresh (not from the MLXD_HOME cache, which an older converter may have made)."""
    from mlx_lm.utils import load

    out = convert_gguf(smollm2_gguf, out=tmp_path_factory.mktemp("smol") / "model", dtype="float32")
    model, tokenizer = load(str(out))
    return out, model, tokenizer


def test_answers_capital_of_france(smollm2) -> None:
    from mlx_lm import generate

    _, model, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system")  # the GGUF's chat template is in use
    text = generate(model, tokenizer, prompt, max_tokens=20)
    assert "Paris" in text


def test_tokenizer_matches_hf(smollm2) -> None:
    _, _, tokenizer = smollm2
    # HF's SmolLM2 tokenizer.json splits digits one by one (Digits pre-tokenizer).
    ids = tokenizer.encode("Hello world 123")
    assert ids == [19556, 905, 216, 33, 34, 35]
    assert tokenizer.convert_ids_to_tokens(ids) == ["Hello", "Ġworld", "Ġ", "1", "2", "3"]
    assert tokenizer.encode("2024") == [34, 32, 34, 36]
    assert tokenizer.decode(ids) == "Hello world 123"
    assert tokenizer.encode("<|im_start|>user") == [1, 4093]  # special tokens stay whole
    assert tokenizer.eos_token_id == 2 and 2 in tokenizer.eos_token_ids
    assert tokenizer.bos_token == "<|im_start|>"


def test_tokenizer_json_matches_hf_layout(smollm2) -> None:
    """Same pre-tokenizer and decoder as HF's SmolLM2 tokenizer.json (llama.cpp calls it
    `smollm`, which transformers' GGUF builder does not know)."""
    out, _, _ = smollm2
    tok = json.loads((out / "tokenizer.json").read_text())
    pre = tok["pre_tokenizer"]
    assert pre["type"] == "Sequence"
    assert [p["type"] for p in pre["pretokenizers"]] == ["Digits", "ByteLevel"]
    assert pre["pretokenizers"][0]["individual_digits"] is True
    assert pre["pretokenizers"][1]["add_prefix_space"] is False
    assert tok["decoder"]["type"] == "ByteLevel"


def test_config_keeps_quantization(smollm2) -> None:
    out, model, _ = smollm2
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert config["quantization"]["bits"] == 4  # Q4_1 layers
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert model.model.embed_tokens.bits == 8 and model.model.layers[0].mlp.up_proj.bits == 4
