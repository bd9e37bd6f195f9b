"""The batched decode step with logit biases (and penalties, grammars) applied to all rows at once.

mlx-lm's GenerationBatch runs logits processors row by row: a slice, the processor and a
concatenate per row, every step (~4 ops a row). A logit bias only adds constants at fixed
token ids, so when it is the only processor in the batch, one scatter over the whole batch
does the same adds to the same logits: the same bits, a handful of ops instead of ~4 per row.
A grammar (structured outputs) masks with one `where` over the batch, free rows untouched, and
its masks are filled on the CPU while the device computes the forward. Repetition, presence and
frequency penalties run kind by kind over the batch (penalties.py). Any other processor
(a caller's callable) takes mlx-lm's own step, unchanged. After every step the layers' RoPE
offsets share one add (kv/step_offsets.py).

`encoder` (`--step-order thread`, overlap.py): a thread of its own reads the last step's tokens
and queues this one (its first layers first, overlap.py) while this thread goes on; anything
here that evaluates settles it first.
"""

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from ..config import THREAD_ROWS
from ..constrain.mask import apply_bitmask
from ..constrain.processor import GrammarLogitsProcessor
from ..kv import step_offsets
from . import culprits
from . import overlap as step_order
from .adapters import no_slots
from .kernel_window import StepClock
from .output import Readout
from .overlap import StepEncoder, StepPhases
from .penalties import apply_penalties
from .sampling import LogitBias, Penalty, sample_rows
from .speculate.drafting import Drafting


def _kinds(processors: list[Any] | None) -> tuple[Any, list[Penalty], Any] | None:
    """(LogitBias or None, penalties, grammar or None) when the row's processors are those,
    in mlx-lm's order (bias, penalties, then the grammar's mask); None for anything else."""
    if not processors:
        return None, [], None  # the usual row, every step: nothing to sort
    procs = list(processors)
    grammar = procs.pop() if procs and isinstance(procs[-1], GrammarLogitsProcessor) else None
    bias = procs.pop(0) if procs and isinstance(procs[0], LogitBias) else None
    if not all(isinstance(p, Penalty) for p in procs):
        return None
    return bias, procs, grammar


class BiasedGenerationBatch(GenerationBatch):
    """GenerationBatch whose step applies logit biases as one scatter and grammar masks as one
    `where`, the masks filled on the CPU while the device runs the forward (see the module doc)."""

    _bias_of: tuple[Any, ...] = ()  # the LogitBias objects the scatter below was built from
    _bias: tuple[mx.array, mx.array, mx.array] | None = None
    _masker: Any = None
    batch_sampling = False  # rows' different samplers in batched calls (sampling.py)
    phases: StepPhases | None = None  # the GIL's switch interval by step phase (overlap.py)
    clock: StepClock | None = None  # the host time of the step's parts (MLXD_KERNELS' window)
    encoder: StepEncoder | None = None  # reads and queues the steps on its thread (overlap.py)
    thread_rows = THREAD_ROWS  # the encoder's floor (fewer rows: pipelined, here)
    _hot = False  # the last step was queued here and the rows have not changed since
    before: list[Any] | None = None  # each layer's offset before the step running now
    # the layers a step changes in place (sliding windows, recurrent state; none for most
    # models), sorted again when the rows change, and their attributes before the step
    _kept_layers: list[int] | None = None
    kept: culprits.Kept | None = None
    failed: list[tuple[int, BaseException]]  # rows whose grammar failed (uid, error): batch.py
    # mlx-lm's next() prefills a joiner's chunk on this thread right after this step: the
    # encoder's queue must be done first (BatchedRows.step)
    settle_after = False
    # uid -> (logprob?, top k) when that row asked for logprob figures (its owner's lookup), and
    # the figures of the tokens the last step returned / the ones now computing (by uid: rows
    # move between steps)
    wants: Callable[[int], tuple[bool, int] | None]
    current_read: dict[int, Readout]
    _next_read: dict[int, Readout]

    @classmethod
    def install(cls, gen: Any, model: Any, batch_sampling: bool) -> "BiasedGenerationBatch":
        """Make this the GenerationBatch of BatchGenerator `gen`: every joining row extends it
        (BatchGenerator never replaces it)."""
        gen._generation_batch = batch = cls.empty(model, gen.sampler)
        batch.batch_sampling = batch_sampling
        batch.wants, batch.current_read, batch._next_read = lambda _uid: None, {}, {}
        return batch

    drafting: Drafting | None = None  # rows that speculate (speculate/), when any joined
    # uids -> a `with` that sets their adapter slots around a model call (engine/adapters.py)
    adapter_rows = staticmethod(no_slots)
    _last_masks: Any = None  # the last step's grammar masks (host), for a verify step

    def next(self) -> list[Any]:
        """GenerationBatch.next, or a verify step when drafting rows have drafts worth it."""
        if self.drafting is None or not self.uids:
            return super().next()
        kinds = [_kinds(p) for p in self.logits_processors]
        if any(k is None for k in kinds):
            return super().next()  # a caller's processor: mlx-lm's own step

        return self.drafting.next(self, super().next, kinds)

    def _step(self) -> tuple[list[int], list[mx.array]]:
        # kept while the step runs: a step that raises is undone from it (generator.py)
        self.before = before = step_offsets.offsets(self.prompt_cache)
        if (layers := self._kept_layers) is None:
            layers = self._kept_layers = culprits.kept_layers(self.prompt_cache)
        if layers:
            self.kept = culprits.keep(self.prompt_cache, layers)
        with self.adapter_rows(self.uids):
            out = self._processed_step()
        self.before = self.kept = None
        step_offsets.share(self.prompt_cache, before)  # one offset add next step, not one a layer
        return out

    def _processed_step(self) -> tuple[list[int], list[mx.array]]:
        self.current_read, self._next_read = self._next_read, {}
        ours = any(self.logits_processors) or self._mixed() or self._reading()
        ours = ours or self.encoder is not None
        if self.phases is not None:  # this step's lines, to switch phases inside them
            self.phases.building()
            ours = True
        if (clock := self.clock) is not None:  # this step's lines, to time their parts
            clock.start()
            ours = True
        if not ours:
            return super()._step()  # nothing this step does otherwise
        kinds = [_kinds(p) for p in self.logits_processors]
        if any(k is None for k in kinds):
            if self.phases is not None:
                self.phases.held.release()  # no queue point of ours in mlx-lm's step
            self.settle()  # mlx-lm's step evaluates on this thread
            self._hot = False
            return super()._step()  # a processor of the caller's own: mlx-lm's step
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        logits = self.process(inputs, logits, kinds)  # type: ignore[arg-type]
        # From here on, GenerationBatch._step's own lines.
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samplers = [
            self.fallback_sampler if s is None else s
            for s in (self.samplers or [None] * len(self.uids))
        ]
        if not samplers or all(s is samplers[0] for s in samplers):
            sampled = (samplers[0] if samplers else self.fallback_sampler)(logprobs)
        elif not self.batch_sampling or (sampled := sample_rows(samplers, logprobs)) is None:
            sampled = mx.concatenate(
                [s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0
            )
        self._next_tokens = sampled
        self._next_logprobs = list(logprobs)
        self._next_read = self._readouts(sampled, self._next_logprobs)
        reads = [a for r in self._next_read.values() for a in r.arrays()]
        if self.phases is not None:
            self.phases.waiting()
        if clock is not None:
            clock.mark("build")
        threaded = self.encoder is not None and len(self.uids) >= self.thread_rows
        if threaded and self._hot:  # the read and the queue on its thread
            read = [inputs, *self._current_logprobs]
            read += [a for r in self.current_read.values() for a in r.arrays()]
            queue = [self._next_tokens, *self._next_logprobs, *reads]
            first = step_order.first_layers(self.prompt_cache, step_order.FIRST_LAYERS)
            tokens = self.encoder.step(read, inputs, queue, first)
            if self.settle_after:  # one command encoder a stream: not two threads inside it
                self.encoder.settle()
            if clock is not None:
                clock.mark("wait")
        else:
            tokens = self._queue_and_read(inputs, reads)
        self._hot = self.encoder is not None
        for history, token in zip(self.tokens, tokens, strict=True):
            history.append(token)
        return tokens, self._current_logprobs

    def process(self, inputs: mx.array, logits: mx.array, kinds: list[tuple]) -> mx.array:
        """Every row's biases, penalties and grammar mask on `logits` (B, vocab), the logits of
        the step that feeds `inputs`; `kinds`: each row's `_kinds`."""
        biases = [k[0] for k in kinds]
        penalties = [k[1] for k in kinds]
        grammars = [k[2] for k in kinds]
        # mlx-lm's token history, for the rows whose processors read it
        contexts = {
            e: self._token_context[e].update_and_fetch(inputs[e : e + 1])
            for e in range(len(kinds))
            if penalties[e] or grammars[e] is not None
        }
        masks = None
        if any(grammars):
            self.settle()  # the masks read the last step's tokens here
            mx.async_eval(logits)  # the forward runs while the CPU fills the masks
            masks = self._masks(inputs, grammars)
        self._last_masks = masks  # a verify step checks its drafts against them
        if any(biases):
            rows, cols, values = self._scatter(biases)
            logits = logits.at[rows, cols].add(values)
        if any(penalties):
            logits = apply_penalties(logits, penalties, contexts)
        if masks is not None:
            constrained = [e for e, g in enumerate(grammars) if g is not None]
            logits = apply_bitmask(logits, masks, constrained)
        return logits

    def _queue_and_read(self, inputs: mx.array, reads: list[mx.array]) -> list[int]:
        """Queue this step and read the last one's tokens on this thread, in the step order."""
        clock = self.clock
        self.settle()
        mx.async_eval(self._next_tokens, self._next_logprobs, *reads)
        if clock is not None:
            clock.mark("encode")
        mx.eval(inputs, self._current_logprobs)
        if clock is not None:
            clock.mark("wait")
        return inputs.tolist()

    def settle(self) -> None:
        """The encoder's last step queued (before this thread evaluates anything)."""
        if self.encoder is not None:
            self.encoder.settle()

    # The rows change (or a row's caches are read): settled first, and the next step queued here
    # (a joiner's arrays may wait on this thread's own stream).
    def filter(self, keep: list[int]) -> None:
        self.settle()
        self._hot, self._kept_layers = False, None
        super().filter(keep)

    def extend(self, batch: Any) -> None:
        self.settle()
        self._hot, self._kept_layers = False, None
        super().extend(batch)

    def extract_cache(self, idx: int) -> list[Any]:
        self.settle()
        return super().extract_cache(idx)

    def _reading(self) -> bool:
        """A row asked for logprob figures (built in this step's graph, not after it)."""
        return any(self.wants(uid) is not None for uid in self.uids)

    def _readouts(self, sampled: mx.array, logprobs: list[mx.array]) -> dict[int, Readout]:
        out = {}
        for e, uid in enumerate(self.uids):
            if (want := self.wants(uid)) is not None:
                out[uid] = Readout.of(want[0], want[1], sampled[e : e + 1], logprobs[e])
        return out

    def _mixed(self) -> bool:
        """Rows hold different samplers and the batched draw is on."""
        samplers = self.samplers or []
        return self.batch_sampling and any(s is not samplers[0] for s in samplers)

    def _masks(self, inputs: mx.array, grammars: list[Any]) -> Any:
        """Feed each constrained row the token this step feeds the model, then fill all their
        masks at once (llguidance fills rows in parallel, without the GIL)."""
        from ..constrain.batch import BatchMasker

        if self._masker is None:
            vocab = next(g for g in grammars if g is not None).matcher.vocab
            self._masker = BatchMasker(vocab)
        tokens = inputs.tolist()  # the previous step's samples: waits for them, not this forward
        for e, g in enumerate(grammars):
            try:
                if g is not None:
                    g.advance(tokens[e])
            except Exception as err:  # noqa: BLE001 - its row ends, unmasked until then
                self.failed.append((self.uids[e], err))
                grammars[e] = None
        return self._masker.fill([g.matcher if g is not None else None for g in grammars])

    def _scatter(self, biases: list[Any]) -> tuple[mx.array, mx.array, mx.array]:
        """(row, token id, bias) of every row's bias, rebuilt when the rows change."""
        of = tuple(biases)  # held, so compared by identity
        if (
            self._bias is None
            or len(of) != len(self._bias_of)
            or any(a is not b for a, b in zip(of, self._bias_of, strict=True))
        ):
            rows, cols, values = [], [], []
            for e, b in enumerate(biases):
                if b is not None:
                    rows.append(mx.full(b.indices.shape, e, dtype=mx.int32))
                    cols.append(b.indices)
                    values.append(b.values)
            self._bias = (mx.concatenate(rows), mx.concatenate(cols), mx.concatenate(values))
            self._bias_of = of
        return self._bias
