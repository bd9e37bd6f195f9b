"""The vision tower for requests that arrive together: each request thread submits its prompt
and waits; one of the waiting threads at a time takes every waiting prompt that fits the pixel
budget (`--vision-batch-pixels`; the first always goes, however large) and runs the tower and
projector over all their images in one call, then hands each prompt its own features. Each
request merges its features into its own embeddings (mlx-vlm's merge of cached features), so a
row gets exactly the embeddings it gets alone. A tower that fails for a batch runs each of its
prompts alone: a failure is only its own request's."""

import threading
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from ..model.vision.prompt import VisionPrompt


@dataclass(eq=False)  # compared by identity
class _Ticket:
    prompt: VisionPrompt
    key: tuple[Any, ...]
    pixels: int
    features: mx.array | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass(eq=False)
class VisionBatcher:
    """Batches `model.image_features` (a VisionModel) over the prompts waiting for it."""

    model: Any
    budget: int  # pixels one tower call may read (beyond its first prompt's)
    calls: list[int] = field(default_factory=list)  # images per tower call, in call order
    _waiting: list[_Ticket] = field(default_factory=list)
    _running: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    def embed(self, prompt: VisionPrompt) -> None:
        """`model.embed(prompt)`, its images' features computed in a call shared with the
        prompts waiting beside it (where its model batches them: `tower_key`)."""
        key = self.model.tower_key(prompt)
        if key is None:
            self.calls.append(_images(prompt))
            self.model.embed(prompt)
            return
        # Its arrays evaluated on this thread's stream: another thread runs the tower on them.
        mx.eval([v for v in prompt.extra.values() if isinstance(v, mx.array)])
        ticket = _Ticket(prompt, key, self.model.image_pixels(prompt))
        with self._cond:
            self._waiting.append(ticket)
            while not ticket.done:
                if self._running:
                    self._cond.wait()
                    continue
                self._running, batch = True, self._take()
                self._cond.release()
                try:
                    self._run(batch)
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._cond.notify_all()
        if ticket.error is not None:
            raise ticket.error
        self.model.embed(prompt, features=ticket.features)

    def _take(self) -> list[_Ticket]:
        """The first waiting prompt and those after it of its key that fit the budget."""
        head = self._waiting[0]
        batch, pixels = [head], head.pixels
        for t in self._waiting[1:]:
            if t.key == head.key and pixels + t.pixels <= self.budget:
                batch.append(t)
                pixels += t.pixels
        self._waiting = [t for t in self._waiting if t not in batch]
        return batch

    def _run(self, batch: list[_Ticket]) -> None:
        """Features for every ticket, or its own error; always marks them done."""
        try:
            try:
                self._features(batch)
            except Exception:  # noqa: BLE001 - alone, each prompt fails only itself
                if len(batch) == 1:
                    raise
                for t in batch:
                    try:
                        self._features([t])
                    except Exception as e:  # noqa: BLE001 - the request's own failure
                        t.error = e
        except BaseException as e:  # noqa: BLE001 - handed to the one waiting request
            batch[0].error = e
        finally:
            for t in batch:
                t.done = True

    def _features(self, batch: list[_Ticket]) -> None:
        features = self.model.image_features([t.prompt for t in batch])
        mx.eval(features)
        self.calls.append(sum(_images(t.prompt) for t in batch))
        for t, f in zip(batch, features, strict=True):
            t.features = f


def _images(prompt: VisionPrompt) -> int:
    grid = prompt.extra.get("image_grid_thw")
    pixels = prompt.extra.get("pixel_values")
    if grid is not None:
        return int(grid.shape[0])
    return int(pixels.shape[0]) if pixels is not None and pixels.ndim == 4 else 1
