"""mlx-vlm's choice of sampler for a row, reused: its `_PositionedTargetSampler` for seeded
rows (a key per generated position, no global PRNG state), its make_sampler otherwise."""

from typing import Any

import mlx.core as mx


class PositionedSampler:
    """A seeded mlx-vlm sampler as the engine calls one (`sampler(logprobs)`): the n-th call
    draws with the key of generated position n, row 0, as generate_step's does."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.position = inner, 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        y = self.inner.sample_target(logprobs, row_ids=[0], positions=[self.position])
        self.position += 1
        return y


def vision_sampler(
    config: Any,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float = 0.0,
    seed: int | None = None,
) -> Any:
    """generate_step's sampler for these arguments (defaults from the checkpoint's config)."""
    from mlx_vlm.generate.ar import _PositionedTargetSampler
    from mlx_vlm.generate.common import resolve_sampling_defaults
    from mlx_vlm.sample_utils import clamp_temperature, make_sampler

    temperature, top_p, top_k = resolve_sampling_defaults(
        config, temperature=temperature, top_p=top_p, top_k=top_k
    )
    temperature = clamp_temperature(temperature)
    if seed is not None and temperature > 0 and min_p == 0.0:
        inner = _PositionedTargetSampler(
            temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
        )
        return PositionedSampler(inner)
    return make_sampler(temp=temperature, top_p=top_p, min_p=min_p, top_k=top_k)
