"""`/v1/embeddings` through the openai SDK on a live server: each vector equals the mean of
mlx-lm's own last hidden state for the input (computed here from mlx-lm's loaded model),
L2-normalized; a request's inputs batched give the same bits as each alone; base64 decodes to
the float list; token inputs, `dimensions`, usage, and OpenAI's 400s."""

import base64
import struct
import threading
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from mlx_lm import load
from openai import BadRequestError, OpenAI

MODEL = "default_model"
TEXTS = ["hello there", "a longer sentence about tokens and vectors", "abc", "hello again"]


@pytest.fixture(scope="module")
def lm(qwen3_model_dir: Path):
    return load(str(qwen3_model_dir))


@pytest.fixture(scope="module")
def client(qwen3_server) -> OpenAI:
    return OpenAI(base_url=qwen3_server.v1, api_key="x", max_retries=0)


def assert_same(got: list[list[float]], alone: list[list[float]]) -> None:
    """Bit for bit on the CPU; a GPU's batched kernels round otherwise (an H100: up to 2e-4)."""
    if mx.default_device() == mx.cpu:
        assert got == alone
    else:
        assert mx.allclose(mx.array(got), mx.array(alone), atol=5e-4).item()


def direct(lm, ids: list[int], dims: int | None = None, at: int | None = None) -> list[float]:
    """mlx-lm's inner model on `ids` alone: the token states' mean (or the state at `at`),
    cut to `dims`, over its L2 norm."""
    hidden = lm[0].model(mx.array([ids]))[0].astype(mx.float32)
    v = hidden.mean(axis=0) if at is None else hidden[at]
    v = v[:dims] if dims is not None else v
    return (v / mx.linalg.norm(v)).tolist()


def test_texts_match_mlx_lm_hidden_states(client, lm) -> None:
    out = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    ids = [lm[1].encode(t) for t in TEXTS]
    assert [d.index for d in out.data] == [0, 1, 2, 3]
    assert_same([d.embedding for d in out.data], [direct(lm, i) for i in ids])
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(map(len, ids))
    assert out.object == "list" and out.data[0].object == "embedding"


def test_batched_equals_each_alone(client) -> None:
    together = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for text, got in zip(TEXTS, together.data, strict=True):
        alone = client.embeddings.create(model=MODEL, input=text, encoding_format="float")
        assert_same([got.embedding], [alone.data[0].embedding])


def test_equal_lengths_share_a_forward_with_the_same_bits(client, lm) -> None:
    ids = [[5, 17, 99, 3], [7, 7, 21, 300], [11, 12, 13, 14], [9, 8]]
    out = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert_same([d.embedding for d in out.data], [direct(lm, i) for i in ids])


def test_base64_decodes_to_the_float_list(qwen3_server, client) -> None:
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    sdk = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64
    assert [d.embedding for d in sdk.data] == [d.embedding for d in floats.data]
    raw = httpx.post(qwen3_server.v1 + "/embeddings",
                     json={"input": TEXTS[0], "encoding_format": "base64"}).json()  # fmt: skip
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == floats.data[0].embedding


def test_token_inputs_equal_text_inputs(client, lm) -> None:
    ids = lm[1].encode(TEXTS[1])
    text = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    one = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    many = client.embeddings.create(model=MODEL, input=[ids, ids[:3]], encoding_format="float")
    assert one.data[0].embedding == text.data[0].embedding == many.data[0].embedding
    assert_same([many.data[1].embedding], [direct(lm, ids[:3])])
    assert one.usage.prompt_tokens == len(ids)


def test_dimensions_cut_and_renormalize(client, lm) -> None:
    out = client.embeddings.create(
        model=MODEL, input=TEXTS[0], dimensions=16, encoding_format="float"
    )
    assert out.data[0].embedding == direct(lm, lm[1].encode(TEXTS[0]), dims=16)
    with pytest.raises(BadRequestError, match="dimensions must be at most 128") as refused:
        client.embeddings.create(model=MODEL, input="x", dimensions=129)
    assert refused.value.body["param"] == "dimensions"


@pytest.mark.parametrize(
    "body, param, says",
    [
        ({"input": ""}, "input", "empty"),
        ({"input": []}, "input", "empty"),
        ({"input": ["a", ""]}, "input", "empty"),
        ({"input": [[1, 2], []]}, "input", "empty"),
        ({"input": [3, 151936]}, "input", "outside the vocabulary"),
        ({"input": [[3], [-1]]}, "input", "outside the vocabulary"),
        ({"input": [1] * 40961}, "input", "maximum context length is 40960"),
        ({"input": [1.5]}, "input", "token id"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions", "positive"),
    ],
)
def test_refusals_in_openais_shape(qwen3_server, body, param, says) -> None:
    r = httpx.post(qwen3_server.v1 + "/embeddings", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert says in error["message"]


def test_the_forward_waits_for_the_engines_turn_lock(qwen3_server, client) -> None:
    lock = qwen3_server.state.provider.default.engine.driver.lock
    done = threading.Event()

    def ask() -> None:
        client.embeddings.create(model=MODEL, input="waits")
        done.set()

    with lock:  # as an engine turn holds it
        thread = threading.Thread(target=ask)
        thread.start()
        assert not done.wait(1.0)
    assert done.wait(30)
    thread.join()


def test_a_sentence_transformers_pooling_config_is_followed(
    make_server, qwen3_model_dir: Path, tmp_path: Path, lm
) -> None:
    folder = tmp_path / "st-model"
    folder.mkdir()
    for f in qwen3_model_dir.iterdir():
        (folder / f.name).symlink_to(f)
    (folder / "modules.json").write_text(
        '[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},'
        ' {"idx": 1, "name": "1", "path": "1_Pooling",'
        ' "type": "sentence_transformers.models.Pooling"}]'
    )
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        '{"pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false,'
        ' "pooling_mode_lasttoken": true}'
    )
    live = make_server(model=str(folder))
    client = OpenAI(base_url=live.v1, api_key="x", max_retries=0)
    ids = lm[1].encode(TEXTS[1])
    out = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    assert out.data[0].embedding == direct(lm, ids, at=-1)
