"""Per-row adapters (mlxd/model/lora): rows with different adapters in one forward each get the
bits of that row alone through mlx-lm's model with the adapter loaded by mlx-lm itself
(`load_adapters`), and slot-0 rows the plain base model's bits. Adapters are made with mlx-lm's
`linear_to_lora_layers` (random a, b and m), saved in its folder format."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import (
    BatchKVCache,
    BatchRotatingKVCache,
    RotatingKVCache,
    make_prompt_cache,
)
from mlx_lm.tuner.dora import DoRALinear
from mlx_lm.tuner.lora import LoRALinear
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters
from mlx_lm.utils import load_model

from mlxd.model.lora import AdapterError, AdapterSlots, MultiLoRALinear, SlotRows
from mlxd.model.lora.stack import Entry, TargetStack, dora_gain

ARCHS = ["llama", "qwen3", "gemma3"]
SLOTS = [0, 1, 2, 1, 3]
# name -> (fine_tune_type, num_layers, lora_parameters): different ranks, blocks and keys, so
# stacks hold zero-padded ranks and slots that leave a linear alone; -1 is every block.
QVD = ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]
OU = ["self_attn.o_proj", "mlp.up_proj"]
SPECS = {
    "a": ("lora", 1, {"rank": 4, "scale": 10.0, "dropout": 0.0}),
    "b": ("lora", -1, {"rank": 8, "scale": 2.5, "dropout": 0.0, "keys": QVD}),
    "c": ("dora", 2, {"rank": 2, "scale": 4.0, "dropout": 0.1, "keys": OU}),
}  # fmt: skip
NAMES = list(SPECS)
LENGTHS = [7, 3, 6, 5, 2]


def quantized(model: nn.Module) -> nn.Module:
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def make_adapter(folder: Path, dest: Path, spec: tuple, seed: int, quant: bool = False) -> Path:
    """An mlx-lm adapter folder: the model's linears converted by mlx-lm, random leaves."""
    kind, num_layers, params = spec
    model = load_model(folder, lazy=True)[0]  # only the shapes (and DoRA's norms) are read
    if quant:
        quantized(model)
    linear_to_lora_layers(model, num_layers, params, use_dora=kind == "dora")
    rng = np.random.default_rng(seed)
    for _, m in model.named_modules():
        if isinstance(m, (LoRALinear, DoRALinear)):
            m.lora_a = mx.array(rng.standard_normal(m.lora_a.shape, dtype=np.float32) * 0.2)
            m.lora_b = mx.array(rng.standard_normal(m.lora_b.shape, dtype=np.float32) * 0.2)
            if isinstance(m, DoRALinear):
                noise = rng.uniform(0.8, 1.2, m.m.shape).astype(np.float32)
                m.m = m.m * mx.array(noise)
    leaves = {"lora_a", "lora_b", "m"}
    weights = {k: v for k, v in tree_flatten(model.parameters()) if k.rsplit(".")[-1] in leaves}
    dest.mkdir(parents=True)
    mx.save_safetensors(str(dest / "adapters.safetensors"), weights)
    config = {"fine_tune_type": kind, "num_layers": num_layers, "lora_parameters": params}
    (dest / "adapter_config.json").write_text(json.dumps(config))
    return dest


class Models:
    """The tiny `arch` model: ours with the three adapters resident, and mlx-lm's references
    (index 0: the plain base model; s: adapter s loaded by mlx-lm's load_adapters)."""

    def __init__(self, folder: Path, dirs: list[Path], quant: bool) -> None:
        def base() -> nn.Module:
            model = load_model(folder)[0]  # mlx_lm.load's model, without its tokenizer
            return quantized(model) if quant else model

        self.refs = [base()]
        for d in dirs:
            ref = load_adapters(base(), str(d))
            ref.eval()  # as mlx_lm.load does after load_adapters: dropout off
            self.refs.append(ref)
        self.ours = base()
        self.slots = AdapterSlots(self.ours)
        assert [self.slots.add(n, d) for n, d in zip(NAMES, dirs, strict=True)] == [1, 2, 3]


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory):
    made: dict[tuple[str, bool], list[Path]] = {}

    def get(arch: str, quant: bool = False) -> list[Path]:
        if (arch, quant) not in made:
            root = tmp_path_factory.mktemp(f"adapters-{arch}-{quant}")
            made[arch, quant] = [
                make_adapter(tiny_model(arch), root / n, SPECS[n], seed=i, quant=quant)
                for i, n in enumerate(NAMES)
            ]
        return made[arch, quant]

    return get


@pytest.fixture(scope="module")
def models(tiny_model: Callable[..., Path], adapter_dirs) -> Callable[..., Models]:
    loaded: dict[tuple[str, bool], Models] = {}

    def get(arch: str, quant: bool = False) -> Models:
        if (arch, quant) not in loaded:
            loaded[arch, quant] = Models(tiny_model(arch), adapter_dirs(arch, quant), quant)
        return loaded[arch, quant]

    return get


def batch_caches(model: nn.Module, pads: list[int]) -> list[Any]:
    """Left-padded batch caches of the kinds the model's own caches are (sliding or full)."""
    return [
        BatchRotatingKVCache(c.max_size, pads)
        if isinstance(c, RotatingKVCache)
        else BatchKVCache(pads)
        for c in make_prompt_cache(model)
    ]


def padded_run(model: nn.Module, prompts: list[list[int]], steps: list[list[int]]) -> list:
    """Prefill the left-padded prompts in one call, then one call per step's tokens (a token a
    row); the last position's logits of every call."""
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    tokens = mx.array([[0] * pad + p for pad, p in zip(pads, prompts, strict=True)])
    caches = batch_caches(model, pads)
    out = [model(tokens, cache=caches)[:, -1, :]]
    for step in steps:
        out.append(model(mx.array(step)[:, None], cache=caches)[:, -1, :])
    mx.eval(out)
    return out


def assert_equal(got: mx.array, want: mx.array, what: str) -> None:
    assert got.dtype == want.dtype == mx.float32, what
    assert mx.array_equal(got, want).item(), what


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_rows_equal_each_row_alone_through_mlx_lm(models, arch: str) -> None:
    m = models(arch)
    rng = np.random.default_rng(7)
    tokens = mx.array(rng.integers(1, 5000, (len(SLOTS), 6)))
    m.slots.rows.set(SLOTS)
    logits = m.ours(tokens)
    for i, s in enumerate(SLOTS):
        want = m.refs[s](tokens[i : i + 1])
        assert_equal(logits[i : i + 1], want, f"row {i} slot {s}")
        m.slots.rows.set([s])  # the same row alone: one slot, mlx-lm's own ops
        assert_equal(m.ours(tokens[i : i + 1]), want, f"row {i} alone, slot {s}")
    # The adapters change every row they adapt: the comparisons above can tell them apart.
    for s in (1, 2, 3):
        assert not mx.array_equal(m.refs[s](tokens[:1]), m.refs[0](tokens[:1])).item()
    m.slots.rows.clear()
    assert_equal(m.ours(tokens), m.refs[0](tokens), "no slots set: the base model")


def serial_run(model: nn.Module, prompt: list[int], steps: list[int]) -> list:
    """One row alone through mlx-lm's own serial caches: the prompt, then a token a call."""
    cache = make_prompt_cache(model)
    out = [model(mx.array([prompt]), cache=cache)[:, -1, :]]
    for token in steps:
        out.append(model(mx.array([[token]]), cache=cache)[:, -1, :])
    mx.eval(out)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_batch_cache_rows_equal_each_row_alone(models, arch: str) -> None:
    """Prefill with left padding into BatchKVCache (BatchRotatingKVCache for sliding layers),
    then decode steps, as the engine batches rows; each row against itself alone, unpadded,
    through mlx-lm's serial caches."""
    m = models(arch)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(1, 5000, n).tolist() for n in LENGTHS]
    steps = [rng.integers(1, 5000, len(SLOTS)).tolist() for _ in range(3)]
    m.slots.set_rows([None if s == 0 else NAMES[s - 1] for s in SLOTS])
    batched = padded_run(m.ours, prompts, steps)
    for i, s in enumerate(SLOTS):
        alone = serial_run(m.refs[s], prompts[i], [t[i] for t in steps])
        for k, (got, want) in enumerate(zip(batched, alone, strict=True)):
            assert_equal(got[i : i + 1], want, f"row {i} slot {s} call {k}")
        m.slots.rows.set([s])  # the B=1 serial path: ours alone, plain caches, one slot
        mine = serial_run(m.ours, prompts[i], [t[i] for t in steps])
        for k, (got, want) in enumerate(zip(mine, alone, strict=True)):
            assert_equal(got, want, f"row {i} alone, slot {s}, call {k}")


def test_quantized_base(models) -> None:
    """QuantizedLinear bases (DoRA dequantizes them, as DoRALinear does)."""
    m = models("qwen3", quant=True)
    assert isinstance(m.ours.layers[-1].self_attn.q_proj.linear, nn.QuantizedLinear)
    tokens = mx.array(np.random.default_rng(3).integers(1, 5000, (len(SLOTS), 5)))
    m.slots.rows.set(SLOTS)
    logits = m.ours(tokens)
    for i, s in enumerate(SLOTS):
        assert_equal(logits[i : i + 1], m.refs[s](tokens[i : i + 1]), f"row {i} slot {s}")


def test_remove_and_add_keep_slots_and_bits(models, adapter_dirs) -> None:
    m = models("llama")
    slots, model = m.slots, m.ours
    wrapped = [p for p, x in model.named_modules() if isinstance(x, MultiLoRALinear)]
    # a: every linear of the last block; b: q/v/down of every block; c: o/up of both blocks.
    assert len(wrapped) == 7 + 3 + 2
    held = slots.nbytes("a")
    dirs = adapter_dirs("llama")
    own = sum(a.nbytes for a in mx.load(str(dirs[0] / "adapters.safetensors")).values())
    assert held > own  # its own arrays plus its rows of the stacks (rank 4 padded to 8 on q/v/down)
    slots.remove("b")
    assert slots.names == ["a", "c"] and slots.capacity == 4
    with pytest.raises(AdapterError, match="no adapter named 'b'"):
        slots.set_rows(["b"])
    assert slots.nbytes("a") < held  # no rank-8 neighbour left to pad to
    tokens = mx.array([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])
    slots.rows.set([3, 0, 1])
    logits = model(tokens)
    for i, s in enumerate([3, 0, 1]):
        assert_equal(logits[i : i + 1], m.refs[s](tokens[i : i + 1]), f"row {i} slot {s}")
    assert slots.add("b", dirs[1]) == 2  # the freed slot, taken again
    slots.rows.set([2, 1])
    logits = model(tokens[:2])
    for i, s in enumerate([2, 1]):
        assert_equal(logits[i : i + 1], m.refs[s](tokens[i : i + 1]), f"row {i} slot {s}")


def test_row_mismatches_are_refused(models) -> None:
    m = models("llama")
    with pytest.raises(ValueError, match="in \\[0, 4\\)"):
        m.slots.rows.set([0, 4])
    m.slots.rows.set([1, 2])
    with pytest.raises(ValueError, match="2 slot ids set for a batch of 3 rows"):
        m.ours(mx.array([[1, 2], [3, 4], [5, 6]]))
    m.slots.rows.clear()


def _folder(tmp_path: Path, config: dict, weights: dict[str, mx.array]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(tmp_path / "adapters.safetensors"), weights)
    return tmp_path


def test_adapters_mlx_lm_refuses_are_refused(models, tmp_path: Path) -> None:
    slots = AdapterSlots(models("llama").refs[0])
    lora = {"rank": 2, "scale": 1.0, "dropout": 0.0}
    a, b = mx.zeros((96, 2)), mx.zeros((2, 192))  # q_proj: 96 -> 3 heads x 64
    ok = {"model.layers.1.self_attn.q_proj.lora_a": a, "model.layers.1.self_attn.q_proj.lora_b": b}
    alpha = {"num_layers": 1, "lora_parameters": {"rank": 2, "alpha": 16, "dropout": 0.0}}
    with pytest.raises(AdapterError, match="'scale'.*alpha"):
        slots.add("x", _folder(tmp_path / "alpha", alpha, ok))
    full = {"fine_tune_type": "full", "num_layers": 1, "lora_parameters": lora}
    with pytest.raises(AdapterError, match="'full' is not an adapter"):
        slots.add("x", _folder(tmp_path / "full", full, ok))
    layer0 = {k.replace("layers.1", "layers.0"): v for k, v in ok.items()}
    cfg = {"num_layers": 1, "lora_parameters": lora}
    with pytest.raises(AdapterError, match="layers.0.self_attn.q_proj is not a module"):
        slots.add("x", _folder(tmp_path / "layer0", cfg, layer0))
    wide = {**ok, "model.layers.1.self_attn.q_proj.lora_b": mx.zeros((2, 191))}
    with pytest.raises(AdapterError, match=r"lora_b: shape \(2, 191\)"):
        slots.add("x", _folder(tmp_path / "wide", cfg, wide))
    assert slots.names == [] and slots.add("x", _folder(tmp_path / "ok", cfg, ok)) == 1


@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [(mx.bfloat16, mx.float32), (mx.bfloat16, mx.bfloat16), (mx.float16, mx.float16)],
)
def test_layer_rows_in_half_precision(x_dtype: mx.Dtype, w_dtype: mx.Dtype) -> None:
    """One biased linear, LoRA and DoRA slots, half-precision inputs (the CPU gathers float32
    only): each row as mlx-lm's LoRALinear / DoRALinear computes it alone."""
    mx.random.seed(5)
    base = nn.Linear(64, 48, bias=True)
    base.update({k: v.astype(x_dtype) for k, v in base.parameters().items()})
    stack, refs = TargetStack("proj", base), {}
    kinds = [(LoRALinear, 4, 3.3), (LoRALinear, 8, 0.7), (DoRALinear, 2, 2.0)]
    for slot, (cls, rank, scale) in enumerate(kinds, 1):
        ref = cls.from_base(base, r=rank, scale=scale)
        ref.lora_a = (mx.random.normal(ref.lora_a.shape) * 0.3).astype(w_dtype)
        ref.lora_b = (mx.random.normal(ref.lora_b.shape) * 0.3).astype(w_dtype)
        gain = dora_gain(base, ref.lora_a, ref.lora_b, scale, ref.m) if cls is DoRALinear else None
        stack.put(slot, Entry(ref.lora_a, ref.lora_b, scale, gain))
        refs[slot] = ref
    stack.rebuild(4)
    rows = SlotRows(4)
    layer = MultiLoRALinear(base, stack, rows)
    ids = [0, 2, 3, 1, 0, 3, 2]
    x = mx.random.normal((len(ids), 3, 64)).astype(x_dtype)
    rows.set(ids)
    out = layer(x)
    for i, s in enumerate(ids):
        want = (refs[s] if s else base)(x[i : i + 1])
        assert out.dtype == want.dtype == x_dtype
        assert mx.array_equal(out[i : i + 1], want).item(), f"row {i} slot {s}"
        rows.set([s])
        assert mx.array_equal(layer(x[i : i + 1]), want).item(), f"row {i} alone, slot {s}"
        rows.set(ids)
