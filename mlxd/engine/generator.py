"""mlx-lm's BatchGenerator whose turn ends only the rows a failure belongs to.

`_next` is mlx-lm 0.32's, stage for stage: the decode step, joiners into the prompt batch, the
rows done prefilling to decoding (their first step), the next prefill chunk. When a stage
raises, its batch is put back as it was before it, each row's forward runs alone
(culprits.probe), the rows whose own input raises are dropped with their error (`failed`, read
by batch.py), and the stage runs again for the rest: the survivors get the bits of a turn in
which those rows had been cancelled. A failure no row's input reproduces (out of memory) is
raised as before, and the engine ends the batch's rows.
"""

import time
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch

from . import culprits
from .culprits import Failed


class RowsGenerator(BatchGenerator):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed: Failed = []  # rows dropped this turn and why

    def _next(self) -> tuple[list[Any], list[Any]]:
        generation_responses: list[Any] = []
        prompt_responses: list[Any] = []
        if len(self._generation_batch) > 0:
            tic = time.perf_counter()
            generation_responses = self._decode()
            self._counters.decode_time += time.perf_counter() - tic
            self._counters.generation_tokens += len(generation_responses)
            self._counters.generation_steps += 1
            if self._counters.generation_steps % 512 == 0:
                mx.clear_cache()
        if len(self._generation_batch) >= self.completion_batch_size:
            return prompt_responses, generation_responses
        n = min(
            self.prefill_batch_size - len(self._prompt_batch),
            self.completion_batch_size - len(self._generation_batch),
            len(self._unprocessed_sequences),
        )
        if n > 0:
            self._prompt_batch.extend(self._make_batch(n))
        keep, split = [], []
        for i, seq in enumerate(self._currently_processing):
            segments = seq[0]
            (split if len(segments) == 1 and len(segments[0]) == 1 else keep).append(i)
        if split:
            last_inputs = [self._currently_processing[i][0][0] for i in split]
            progress = [(self._currently_processing[i][2],) * 2 for i in split]
            self._currently_processing = [self._currently_processing[i] for i in keep]
            wave = self._prompt_batch.split(split)
            kept, gen_batch = self._isolated(wave, last_inputs, wave.generate)
            if gen_batch is not None:
                for i, uid in zip(kept, gen_batch.uids, strict=True):
                    done = PromptProcessingBatch.Response(uid, progress[i], True, True)
                    prompt_responses.append(done)
                self._generation_batch.extend(gen_batch)
        prompts = []
        for i, seq in enumerate(self._currently_processing):
            response = PromptProcessingBatch.Response(self._prompt_batch.uids[i], 0, False, False)
            segments = seq[0]
            n = min(len(segments[0]), self.prefill_step_size)
            prompts.append(segments[0][:n])
            segments[0] = segments[0][n:]
            if len(segments[0]) == 0:
                segments.pop(0)
                response.end_of_segment = True
            seq[1] += len(prompts[-1])
            response.progress = (seq[1], seq[2])
            prompt_responses.append(response)
        self._counters.prompt_tokens += sum(len(p) for p in prompts)
        tic = time.perf_counter()
        if prompts:  # mlx-lm's prompt() of no rows does nothing
            uids = list(self._prompt_batch.uids)
            kept, _ = self._isolated(self._prompt_batch, prompts, self._prompt_batch.prompt)
            if len(kept) < len(uids):
                self._currently_processing = [self._currently_processing[i] for i in kept]
                gone = set(uids) - {uids[i] for i in kept}
                prompt_responses = [r for r in prompt_responses if r.uid not in gone]
        self._counters.prompt_time += time.perf_counter() - tic
        return prompt_responses, generation_responses

    def _decode(self) -> list[Any]:
        """The decode step (decode_step.py's); a failed one is undone and run without the rows
        whose own token raises."""
        batch = self._generation_batch
        while True:
            registers = batch._next_tokens, batch._next_logprobs, batch._next_read
            try:
                return batch.next()
            except Exception:
                before, kept, batch.before, batch.kept = batch.before, batch.kept, None, None
                if not culprits.undo_step(batch.prompt_cache, before, kept):
                    raise
                batch._next_tokens, batch._next_logprobs, batch._next_read = registers
                batch.settle()
                inputs = [batch._next_tokens[i : i + 1] for i in range(len(batch))]
                bad = culprits.probe(batch.model, batch.prompt_cache, inputs)
                if not bad:
                    raise
                self.failed += [(batch.uids[i], e) for i, e in bad.items()]
                batch.filter([i for i in range(len(batch)) if i not in bad])

    def _isolated(self, batch: Any, inputs: list[Any], run: Any) -> tuple[list[int], Any]:
        """`run(inputs)` on a prompt batch; when it raises, the batch as before it, and again
        without the rows whose own input raises. (indices of `inputs` kept, what `run` gave;
        None when no row is left)."""
        kept = list(range(len(inputs)))
        while kept:
            saved = culprits.save(batch)
            try:
                return kept, run([inputs[i] for i in kept])
            except Exception:
                culprits.restore(batch, saved)
                bad = culprits.probe(batch.model, batch.prompt_cache, [inputs[i] for i in kept])
                if not bad:
                    raise
                self.failed += [(batch.uids[i], e) for i, e in bad.items()]
                batch.filter([i for i in range(len(kept)) if i not in bad])
                kept = [k for i, k in enumerate(kept) if i not in bad]
        return kept, None
