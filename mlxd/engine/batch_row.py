"""A batched row's state and the batched step's knobs: what BatchedRows (batch.py) holds per
row, and mlx-lm's rule for which requests may join the batch at all."""

from dataclasses import dataclass, field
from typing import Any

from mlx_lm.models.cache import QuantizedKVCache

from .gil import StepPhases
from .handle import RequestHandle
from .output import RowOutput
from .prefix import Plan
from .request import GenerationRequest
from .sampling import Key, KeyedSampler
from .step_clock import StepClock
from .step_order import THREAD_ROWS


@dataclass
class BatchedRow:
    req: GenerationRequest
    handle: RequestHandle
    out: RowOutput
    key: Key | None = None  # the row's own PRNG stream (seeded, known draws per token)
    uid: int = -1
    generated: list[int] = field(default_factory=list)

    keyed: KeyedSampler | None = None
    plan: Plan | None = None  # the prefix store's plan for this row
    cuts: list[int] = field(default_factory=list)  # snapshot positions still ahead of it
    offset: int = 0  # tokens in its cache when it was inserted
    processors: list[Any] | None = None  # its own, when siblings of one request need twins

    def sampler(self):
        if self.key is None or self.req.draws is None or self.req.sampler is None:
            return self.req.sampler  # unseeded: the engine thread's shared key, as mlx-lm
        self.keyed = KeyedSampler(self.req.sampler, self.key, self.req.draws)
        return self.keyed

    def current_key(self) -> Key | None:
        return self.keyed.key if self.keyed is not None else None


@dataclass
class BatchConfig:
    """BatchGenerator's knobs (mlx-lm's defaults derive from the engine's row cap)."""

    completion_batch_size: int = 8
    prefill_batch_size: int = 8
    prefill_step_size: int = 2048
    max_kv_size: int | None = None  # one size for every batched row (rotating caches)
    attention: str = "mlx"  # or folded/flash(+fused): model/folded_attention.py (opt-in)
    # mx.clear_cache() after each prefill chunk (mlx-lm's, batch_prompt.py), a finished serial
    # row and a closed batch; off where a clear is slow (CUDA). Buffers only: the same bits.
    clear_cache: bool = True
    # One-token steps over 2-D rows, fewer views: the serial row's and the mlx mode's batch's
    # (model/plain_rows.py; the same kernels and bits). Off: mlx-lm's model call as it is.
    decode_rows: bool = True
    # With decode_rows, a lone row's q/k/v and gate/up as one matmul each (plain_rows.py's
    # `fuse`: the same bits at one row on CUDA's gemv and the CPU; stacked in place, no copy).
    decode_fused: bool = False
    batch_sampling: bool | None = None  # rows' samplers in batched calls (None: where proven)
    prefill_tokens: int | None = None  # a wave's token budget (prompt_waves.py; None: rows only)
    phases: StepPhases | None = None  # the GIL's switch interval by step phase (gil.py)
    clock: StepClock | None = None  # the host time of a step's parts (MLXD_KERNELS, step_clock.py)
    # When the batched step is queued against the last one: pipelined (mlx-lm's), wait or
    # split (step_order.py; the same bits); split_fraction: split's share of layers queued first.
    step_order: str = "pipelined"
    split_fraction: float = 0.33
    thread_rows: int = THREAD_ROWS  # thread: the fewest rows whose steps go to the encoder
    # A batched prefill's mask handed to MLX-CUDA's cuDNN attention already additive, for the
    # models that take it so (kv/additive_mask.py; the same bits, without MLX's full-size copy).
    additive_mask: bool = True


def batchable(req: GenerationRequest, config: BatchConfig) -> str | None:
    """None when the request can share the batched step, else the reason it runs alone.
    mlx-lm's rule: a row is batchable when every one of its cache layers can merge."""
    if req.max_kv_size != config.max_kv_size:
        return "a max_kv_size other than the engine's runs one row at a time"
    if req.input_embeddings is not None:
        return "input embeddings run one row at a time"
    if req.prompt_cache is not None and not all(_merges(c) for c in req.prompt_cache):
        return "a prompt_cache with layers that cannot merge runs one row at a time"
    return None


def _merges(layer: Any) -> bool:
    return hasattr(layer, "merge") or type(layer) is QuantizedKVCache  # see kv.mergeable
