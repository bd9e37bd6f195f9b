"""mlx-lm's one-token step over 2-D rows (mlxd/model/plain_rows.py): its bits for a lone row and
for a padded batch, fewer view nodes, and a twin made again when the model's modules or weights
change.

The reference is the caller's model stepped as mlx-lm steps it (generate_step's loop: its own
caches, a one-token call per step); the parity suite checks the engine's serial path against
generate_step itself with the twin on (its default). On MLX-CUDA this file is the check that
the rows step keeps mlx-lm's kernels there (bench/h200/cuda_tests.sh)."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from fixtures.folded_models import (
    PROMPTS,
    count_rows_calls,
    load_model,
    padded_decode,
    qwen2_model,
)
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache, make_prompt_cache

from bench.probes.probe_ops import VIEWS, primitives
from mlxd.config import EngineConfig
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.model import plain_rows as pr
from mlxd.model import rows_step as rs
from mlxd.model.gemma_rows import GemmaMLP
from mlxd.model.phi_rows import PhiMLP, PhiRowsAttention


@pytest.fixture
def rows_calls(monkeypatch) -> list[int]:
    """Counts the plain rows step's attention calls (Phi-3's wrapper's too)."""
    return count_rows_calls(monkeypatch, pr.PlainRowsAttention, PhiRowsAttention)


def decode(model, steps: int, rows: int = 1, cache=None) -> mx.array:
    """A prefill of `rows` equal-length prompts, then greedy one-token steps: every logits."""
    tokens = mx.array([PROMPTS[2][i:] + PROMPTS[2][:i] for i in range(rows)])
    cache = make_prompt_cache(model) if cache is None else cache
    logits = [model(tokens, cache=cache)[:, -1, :]]
    for _ in range(steps):
        logits.append(model(mx.argmax(logits[-1], axis=-1)[:, None], cache=cache)[:, -1, :])
    return mx.stack(logits)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_rows_step_equals_mlx_lms_step_bit_for_bit(model, rows, rows_calls) -> None:
    steps = 8
    ref = decode(model, steps, rows)
    assert rows_calls == []
    twin = pr.plain_rows(model)
    assert twin is not model and twin.model.layers[0].self_attn.inner is model.layers[0].self_attn
    assert mx.array_equal(decode(twin, steps, rows), ref).item()
    assert len(rows_calls) == steps * len(model.layers)  # every decode step, every layer


def test_a_padded_batch_step_equals_mlx_lms_bit_for_bit(model, rows_calls) -> None:
    """BatchGenerator's `mlx` mode: left-padded rows under the batch caches' mask arrays, which
    go to mlx-lm's attention call as they came."""
    steps = 8
    ref = padded_decode(model, steps, [0, 4, 9])
    assert mx.array_equal(padded_decode(pr.plain_rows(model), steps, [0, 4, 9]), ref).item()
    assert len(rows_calls) == steps * len(model.layers)


@pytest.mark.parametrize("kind", ["quantized", "rotating"])
def test_quantized_and_rotating_caches_keep_their_bits(tiny_model, kind, rows_calls) -> None:
    """Quantized KV takes mlx-lm's quantized attention through the same call; a rotating
    cache smaller than the prompt plus the steps wraps around while decoding."""
    model = load_model(tiny_model, "qwen3")

    def cache():
        if kind == "quantized":
            return [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]
        return [RotatingKVCache(max_size=14, keep=2) for _ in model.layers]

    ref = decode(model, 8, cache=cache())
    assert mx.array_equal(decode(pr.plain_rows(model), 8, cache=cache()), ref).item()
    assert rows_calls  # the rows step ran


def _step_graph(model):
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([PROMPTS[0]]), cache=cache))
    return primitives(model(mx.array([[3]]), cache=cache))


@pytest.mark.parametrize("arch,projections", [("qwen3", 7), ("gemma3", 7), ("phi3", 4)])
def test_the_rows_step_drops_the_per_layer_views(tiny_model, arch, projections) -> None:
    """What it is for. Counted by hand from mlx-lm's qwen3 block (Gemma 3's has the same; Phi-3
    fuses q/k/v and gate/up, so 4 projections): a layer's projections are each a Flatten, a
    weight Transpose and an Unflatten around the matmul, and q, k, v and the output each a head
    Transpose; over rows none of those is left (the CPU's attention fallback keeps its own, the
    same in both)."""
    model = load_model(tiny_model, arch)
    n = len(model.layers)
    plain, rows = _step_graph(model), _step_graph(pr.plain_rows(model))
    assert plain["Flatten"] - rows["Flatten"] == projections * n
    assert plain["Unflatten"] - rows["Unflatten"] == projections * n
    assert plain["Transpose"] - rows["Transpose"] == (projections + 4) * n
    ops = {k: v for k, v in rows.items() if k not in VIEWS}
    assert ops == {k: v for k, v in plain.items() if k not in VIEWS}  # the same ops


def test_the_twin_is_made_again_when_a_weight_or_module_changes(tiny_model) -> None:
    model = load_model(tiny_model, "qwen3")
    twins = pr.PlainRowsTwin()
    first = twins.of(model)
    assert twins.of(model) is first  # nothing changed: the same twin
    attn = model.layers[0].self_attn
    attn.q_proj.weight = attn.q_proj.weight * 2  # what model.update / load_weights do
    mx.eval(attn.q_proj.weight)
    second = twins.of(model)
    assert second is not first
    assert mx.array_equal(decode(second, 4), decode(model, 4)).item()
    assert not mx.array_equal(decode(first, 4), decode(model, 4)).item()  # the stale one
    nn.quantize(model, group_size=32, bits=4)  # every Linear module replaced
    third = twins.of(model)
    assert third is not second
    assert mx.array_equal(decode(third, 4), decode(model, 4)).item()
    other = qwen2_model()
    assert twins.of(other) is not third  # another model: its own twin
    assert mx.array_equal(decode(twins.of(other), 4), decode(other, 4)).item()


def test_a_model_it_does_not_know_is_stepped_as_it_is(tiny_model) -> None:
    model = load_model(tiny_model, "lfm2")  # short convolutions between its attention layers
    assert not pr.supports(model)
    assert pr.plain_rows(model) is model and pr.PlainRowsTwin().of(model) is model


@pytest.mark.parametrize("arch,mlp", [("gemma3", GemmaMLP), ("phi3", PhiMLP)])
def test_other_families_rows_steps_equal_mlx_lms_bit_for_bit(tiny_model, arch, mlp, rows_calls):
    """Gemma 3's own block (four norms, clipped residuals, a gelu-gated MLP: gemma_rows.py),
    its 16-token sliding layers' rotating caches wrapping while decoding; Phi-3's fused q/k/v
    and gate/up projections split by columns (phi_rows.py). 1 and 2 rows."""
    model = load_model(tiny_model, arch)
    twin = pr.plain_rows(model)
    assert isinstance(twin.model.layers[0].mlp, mlp)
    for rows in (1, 2):
        before = len(rows_calls)
        ref = decode(model, 10, rows)
        assert mx.array_equal(decode(twin, 10, rows), ref).item()
        assert len(rows_calls) - before == 10 * len(model.layers)


def _text_side(tiny_model, arch: str, module) -> nn.Module:
    """mlx-lm's model of a multimodal checkpoint (module.Model: the text model as its
    `language_model`) around the tiny `arch` model, as its loader builds it."""
    import json

    text = load_model(tiny_model, arch)
    config = json.loads((tiny_model(arch) / "config.json").read_text())
    args = module.ModelArgs(model_type=module.__name__.rsplit(".")[-1], text_config=config)
    if hasattr(args, "vocab_size"):
        args.vocab_size = config["vocab_size"]
    outer = module.Model(args)
    outer.language_model = text
    return outer


@pytest.mark.parametrize("arch,kind", [("qwen3", "qwen3_vl"), ("gemma3", "gemma3")])
def test_a_multimodal_models_text_side_takes_the_rows_step(tiny_model, arch, kind, rows_calls):
    """qwen3_vl, gemma3 (and qwen2_vl, pixtral, mistral3) hold the text model as
    `language_model`: its layers step over rows, with the same bits, and the twin is made
    again when the text model is replaced."""
    import importlib

    outer = _text_side(tiny_model, arch, importlib.import_module(f"mlx_lm.models.{kind}"))
    twins = pr.PlainRowsTwin()
    twin = twins.of(outer)
    assert twin is not outer and type(twin) is type(outer)
    assert twin.language_model.model.layers[0].self_attn.inner is outer.layers[0].self_attn
    assert mx.array_equal(decode(twin, 6), decode(outer, 6)).item()
    assert len(rows_calls) == 6 * len(outer.layers)
    assert twins.of(outer) is twin
    outer.language_model = load_model(tiny_model, arch)
    again = twins.of(outer)
    assert again is not twin and again.layers[0].self_attn.inner is outer.layers[0].self_attn


def test_a_wrapper_that_forwards_attributes_is_stepped_as_it_is(tiny_model) -> None:
    """A caller's wrapper (counting calls, scripting outputs) keeps its own __call__: a twin
    of what it wraps would bypass it."""

    class Counting:
        def __init__(self, inner) -> None:
            self.inner, self.calls = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, *args, **kwargs):
            self.calls += 1
            return self.inner(*args, **kwargs)

    class Holder(nn.Module):  # a Module whose `model` is a whole mlx-lm model, not its layers'
        def __init__(self, inner) -> None:
            super().__init__()
            self.model = inner

    inner = load_model(tiny_model, "qwen3")
    assert pr.supports(inner)
    for wrapper in (Counting(inner), Holder(inner)):
        assert not pr.supports(wrapper) and pr.PlainRowsTwin().of(wrapper) is wrapper


def test_a_held_mlp_is_the_mlp_bit_for_bit(tiny_model) -> None:
    mlp = load_model(tiny_model, "llama").layers[0].mlp
    held = rs.HeldMLP(mlp)
    x = mx.random.normal((3, mlp.gate_proj.weight.shape[1]), key=mx.random.key(1))
    assert mx.array_equal(held.rows(x), mlp(x)).item()
    assert mx.array_equal(held(x[:, None]), mlp(x[:, None])).item()  # 3-D: the module itself


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_the_engine_steps_a_lone_row_on_the_twin_unless_it_is_off(
    tiny_model, arch, rows_calls
) -> None:
    model = load_model(tiny_model, arch)
    prompt = mx.array(PROMPTS[0])
    outs = {}
    for on in (True, False):
        engine = Engine(model, config=EngineConfig(8, 8, 2048, decode_rows=on))
        try:
            assert (engine.step_model() is model) is not on
            before = len(rows_calls)
            events = list(engine.submit(GenerationRequest(prompt=prompt, max_tokens=5)))
            outs[on] = [(e.token, e.logprobs) for e in events if e.token is not None]
            assert (len(rows_calls) > before) is on
        finally:
            engine.close()
    assert len(outs[True]) == 5
    assert [t for t, _ in outs[True]] == [t for t, _ in outs[False]]
    assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(*outs.values(), strict=True))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3"])
def test_the_engines_mlx_mode_batch_steps_on_the_twin_unless_it_is_off(
    tiny_model, arch, rows_calls
) -> None:
    """Three prompts submitted together decode as one batch (`mlx` attention): the same tokens
    and logprob arrays with the rows step on and off, and on it ran with several rows."""
    from fixtures.folded_models import PROMPTS as prompts

    model = load_model(tiny_model, arch)
    outs = {}
    for on in (True, False):
        engine = Engine(model, config=EngineConfig(8, 8, 2048, decode_rows=on))
        try:
            before = len(rows_calls)
            reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=6) for p in prompts]
            handles = engine.submit_many(reqs)
            outs[on] = [[(e.token, e.logprobs) for e in h if e.token is not None] for h in handles]
            assert (len(rows_calls) > before) is on
            assert engine.paths["batched"] == len(prompts)
        finally:
            engine.close()
    for a, b in zip(outs[True], outs[False], strict=True):
        assert len(a) == 6 and [t for t, _ in a] == [t for t, _ in b]
        assert all(mx.array_equal(x, y).item() for (_, x), (_, y) in zip(a, b, strict=True))


def test_a_dropped_model_is_freed_and_its_engine_closed(tiny_model) -> None:
    """The Python API's engine holds the twin, which must not keep the model itself alive (the
    engine closes when the model is collected: engine/api.py)."""
    import gc
    import weakref

    from mlx_lm import load

    from mlxd.engine import api
    from mlxd.engine.api import stream_generate

    model, tokenizer = load(str(tiny_model("qwen3")))
    out = [r.token for r in stream_generate(model, tokenizer, mx.array(PROMPTS[0]), max_tokens=3)]
    assert len(out) == 3
    key, engine = id(model), api._engines[id(model)]
    assert engine.step_model() is not model  # the twin was made and is held
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None and key not in api._engines


@pytest.mark.parametrize("flag", [None, "rows", "rows+fused", "mlx"])
def test_serve_takes_the_decode_step(tiny_model, tmp_path, flag) -> None:
    from mlxd.cli.serve import parse_config
    from mlxd.serve.main import make_state

    flags = ["--model", str(tiny_model("qwen3")), "--data-dir", str(tmp_path)]
    flags += [] if flag is None else ["--decode-step", flag]
    state = make_state(parse_config(flags))
    try:
        engine = state.provider.default.engine
        assert engine.config.decode_rows is (flag != "mlx")  # rows by default
        assert engine.config.decode_fused is (flag == "rows+fused")
        assert (engine.step_model() is engine.model) is (flag == "mlx")
    finally:
        state.provider.close()


@pytest.mark.parametrize("shape", ["gemma3-host", "phi4-host"])
def test_the_benchs_other_family_shapes_take_the_rows_step(shape, rows_calls) -> None:
    """probe_overhead's --shape gemma3-1b / phi4-mini (and their host-bound tiny-width twins)
    build models whose one-token steps run over rows, with mlx-lm's bits."""
    from mlxd.bench.models import build_random

    model = build_random(shape, "bfloat16").model
    assert pr.supports(model)
    assert mx.array_equal(decode(pr.plain_rows(model), 3), decode(model, 3)).item()
    assert len(rows_calls) == 3 * len(model.layers)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2", "gemma3"])
def test_a_lone_rows_stacked_projections_keep_mlx_lms_bits(tiny_model, arch, rows_calls) -> None:
    """`--decode-step rows+fused`: one row's q/k/v and gate/up as one matmul each give mlx-lm's
    bits (on CUDA's gemv by construction, checked here on this backend); two rows keep the
    separate projections, so the same bits as well; the stacks are the layers' own weights.
    Gemma 3 stacks q/k/v only (its MLP keeps GemmaMLP)."""
    model = qwen2_model() if arch == "qwen2" else load_model(tiny_model, arch)
    twin = pr.plain_rows(model, fuse=True)
    attn, mlp = twin.model.layers[0].self_attn, twin.model.layers[0].mlp
    assert attn.qkv is not None
    assert isinstance(mlp, GemmaMLP if arch == "gemma3" else pr.OneRowFusedMLP)
    inner = model.layers[0].self_attn
    q, k, v = (getattr(inner, n).weight for n in ("q_proj", "k_proj", "v_proj"))
    assert mx.array_equal(attn.qkv.arrays["weight"], mx.concatenate([q, k, v])).item()
    calls: list[int] = []
    for layer in twin.model.layers:  # count the stacked matmuls' rows
        real = layer.self_attn.qkv
        layer.self_attn.qkv = lambda x, real=real: calls.append(x.shape[0]) or real(x)
    for rows in (1, 2):
        ref = decode(model, 6, rows)
        assert mx.array_equal(decode(twin, 6, rows), ref).item(), rows
    assert calls == [1] * 6 * len(model.layers)  # one row's steps only
    x = mx.random.normal((1, q.shape[1]), key=mx.random.key(2)).astype(q.dtype)
    assert mx.array_equal(mlp.rows(x), model.layers[0].mlp(x)).item()


def test_the_engine_takes_rows_fused_and_makes_the_twin_again_when_it_changes(tiny_model):
    model = load_model(tiny_model, "qwen3")
    engine = Engine(model, config=EngineConfig(8, 8, 2048, decode_fused=True))
    try:
        fused = engine.step_model()
        assert fused.model.layers[0].self_attn.qkv is not None
        events = list(engine.submit(GenerationRequest(prompt=mx.array(PROMPTS[0]), max_tokens=5)))
        assert len([e for e in events if e.token is not None]) == 5
        engine.config.decode_fused = False
        plain = engine.step_model()
        assert plain is not fused and plain.model.layers[0].self_attn.qkv is None
        assert engine.step_model() is plain  # made once per setting
    finally:
        engine.close()


def test_the_lone_rows_stacks_are_the_fused_batchs_own(tiny_model) -> None:
    """rows+fused and folded+fused stack the same layers once (the layers then read their rows
    of the stacks: fused_projections.py), and a replaced weight makes new stacks."""
    from mlxd.model.folded_attention import folded

    model = load_model(tiny_model, "qwen3")
    batch = folded(model, fuse=True)
    lone = pr.plain_rows(model, fuse=True)
    a, b = batch.model.layers[0].self_attn.qkv, lone.model.layers[0].self_attn.qkv
    assert a.arrays["weight"] is b.arrays["weight"]
    layer = model.layers[0].self_attn
    layer.k_proj.weight = layer.k_proj.weight * 2
    again = pr.plain_rows(model, fuse=True).model.layers[0].self_attn.qkv
    assert again.arrays["weight"] is not b.arrays["weight"]
    assert mx.array_equal(again.arrays["weight"][256:320], layer.k_proj.weight).item()
    assert mx.array_equal(decode(pr.plain_rows(model, fuse=True), 4), decode(model, 4)).item()


def test_a_quantized_model_keeps_its_separate_projections_under_rows_fused(tiny_model) -> None:
    """The stacks' bits rest on MLX's unquantized gemv: 4-bit layers are not stacked."""
    model = load_model(tiny_model, "qwen3")
    nn.quantize(model, group_size=32, bits=4)
    twin = pr.plain_rows(model, fuse=True)
    assert twin.model.layers[0].self_attn.qkv is None
    assert not isinstance(twin.model.layers[0].mlp, pr.OneRowFusedMLP)
    assert mx.array_equal(decode(twin, 4), decode(model, 4)).item()
