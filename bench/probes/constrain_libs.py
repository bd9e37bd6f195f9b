"""The two grammar libraries behind one small interface, for `python -m bench.probes.constrain`.

Both fill the same bitmask layout ([B, ceil(V/32)] int32, bit i of word w = token 32w+i) into
numpy arrays, so the same `mlxd.constrain.mask.apply_bitmask` applies either on the device.
xgrammar is optional: its package imports torch (a hard dependency), so it is measured from a
separate environment when installed there.
"""

import json
import time
from typing import Any

import numpy as np


class Llguidance:
    name = "llguidance"

    def __init__(self, hf: Any, eos: list[int], threads: int) -> None:
        import llguidance as llg

        from mlxd.constrain import Constraint, GrammarCompiler

        self.llg, self.Constraint = llg, Constraint
        t = time.perf_counter()
        self.compiler = GrammarCompiler(hf, eos_token_ids=eos, cache_size=0)
        self.tokenizer_s = time.perf_counter() - t
        self.vocab = self.compiler.vocab
        self.executor = llg.LLExecutor(threads)
        self.templates: dict[str, Any] = {}

    def _constraint(self, kind: str, source: Any) -> Any:
        C = self.Constraint  # "any" whitespace: as xgrammar's any_whitespace=True below
        if kind == "json":
            return C.json_schema(source, whitespace="any")
        if kind == "json_object":
            return C.json_object(whitespace="any")
        return getattr(C, kind)(source)

    def compile(self, kind: str, source: Any) -> Any:
        """Uncached compile; returns the template matcher."""
        return self.compiler.compile(self._constraint(kind, source))

    def cached(self, kind: str, source: Any) -> Any:
        key = json.dumps([kind, source])
        if key not in self.templates:
            self.templates[key] = self.compile(kind, source)
        return self.templates[key]

    def matcher(self, compiled: Any) -> Any:
        return compiled.matcher()

    def fill(self, m: Any, bitmask: np.ndarray, i: int) -> None:
        m.fill(bitmask[i])

    def fill_batch(self, ms: list[Any], bitmask: np.ndarray) -> None:
        pairs = [(m.inner, i) for i, m in enumerate(ms)]
        words = bitmask.shape[1]
        self.executor.unsafe_compute_mask_ptr(pairs, bitmask.ctypes.data, words * 4, len(ms))

    def accept(self, m: Any, token: int) -> bool:
        return m.accept(token)

    def error(self, kind: str, source: Any) -> str | None:
        try:
            self.compile(kind, source)
        except ValueError as e:
            return str(e)
        return None


class Xgrammar:
    name = "xgrammar"

    def __init__(self, hf: Any, eos: list[int], threads: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        t = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=eos)
        self.tokenizer_s = time.perf_counter() - t
        self.vocab = info.vocab_size
        self.threads = threads
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self.cached_compiler = xgr.GrammarCompiler(info, max_threads=threads)
        self.batch = xgr.BatchGrammarMatcher(threads)

    def _compile(self, c: Any, kind: str, source: Any) -> Any:
        if kind == "json":
            return c.compile_json_schema(json.dumps(source), any_whitespace=True)
        if kind == "regex":
            return c.compile_regex(source)
        if kind == "choice":
            ebnf = "root ::= " + " | ".join(json.dumps(o) for o in source)
            return c.compile_grammar(ebnf)
        if kind == "json_object":
            return c.compile_builtin_json_grammar()
        return c.compile_grammar(source)

    def compile(self, kind: str, source: Any) -> Any:
        return self._compile(self.compiler, kind, source)

    def cached(self, kind: str, source: Any) -> Any:
        return self._compile(self.cached_compiler, kind, source)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, bitmask: np.ndarray, i: int) -> None:
        m.fill_next_token_bitmask(bitmask, i)

    def fill_batch(self, ms: list[Any], bitmask: np.ndarray) -> None:
        self.batch.batch_fill_next_token_bitmask(ms, bitmask)

    def accept(self, m: Any, token: int) -> bool:
        return m.accept_token(token)

    def error(self, kind: str, source: Any) -> str | None:
        try:
            self.compile(kind, source)
        except Exception as e:  # xgrammar raises RuntimeError / InvalidJSONSchemaError
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return None


LIBS = {"llguidance": Llguidance, "xgrammar": Xgrammar}
