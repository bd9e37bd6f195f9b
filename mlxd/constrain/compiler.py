"""Compile constraints for one tokenizer, once: the tokenizer's token table is built once per
tokenizer (about a second or two), compiled grammars are kept in an LRU keyed by the
constraint (kind, canonical source, options), and `compiler_for` shares one compiler per
tokenizer identity (a hash of its serialised tokenizer and EOS ids) across the process.
"""

import hashlib
import threading
import weakref
from collections import OrderedDict
from copy import copy
from typing import Any

import llguidance as llg

from .grammar import grammar_text
from .matcher import Matcher
from .spec import Constraint, ConstraintError


def _hf(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer: the argument, or the one under an mlx-lm TokenizerWrapper."""
    if hasattr(tokenizer, "backend_tokenizer"):
        return tokenizer
    inner = getattr(tokenizer, "_tokenizer", None)
    if inner is None or not hasattr(inner, "backend_tokenizer"):
        raise ValueError("structured outputs need a Hugging Face fast tokenizer")
    return inner


def _eos_ids(tokenizer: Any) -> list[int]:
    ids = getattr(tokenizer, "eos_token_ids", None)  # mlx-lm's wrapper: all stop ids
    if not ids:
        eos = getattr(_hf(tokenizer), "eos_token_id", None)
        ids = [] if eos is None else [eos]
    return sorted(int(i) for i in ids)


class CompiledGrammar:
    """A compiled constraint: a pristine matcher that `matcher()` copies (a copy is ~10 µs and
    shares the lexer the template has built so far)."""

    __slots__ = ("constraint", "_template", "vocab", "eos", "warnings")

    def __init__(
        self, constraint: Constraint, template: llg.LLMatcher, vocab: int, eos: frozenset[int]
    ) -> None:
        self.constraint = constraint
        self._template = template
        self.vocab = vocab
        self.eos = eos
        self.warnings: list[str] = template.get_grammar_warnings()

    def matcher(self) -> Matcher:
        return Matcher(self._template.deep_copy(), self.vocab, self.eos)


class GrammarCompiler:
    """Compiles `Constraint`s against one tokenizer (an mlx-lm TokenizerWrapper or a Hugging
    Face fast tokenizer). Thread-safe; compiling releases the GIL."""

    def __init__(
        self, tokenizer: Any, *, eos_token_ids: list[int] | None = None, cache_size: int = 256
    ) -> None:
        backend = copy(_hf(tokenizer).backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        serialised = backend.to_str()
        self.eos_token_ids = sorted(eos_token_ids) if eos_token_ids else _eos_ids(tokenizer)
        if not self.eos_token_ids:
            raise ValueError("the tokenizer has no EOS token: a grammar could never end")
        self.fingerprint = hashlib.sha256(
            (serialised + repr(self.eos_token_ids)).encode()
        ).hexdigest()
        self.tokenizer = llg.LLTokenizer(serialised, eos_token=self.eos_token_ids)
        self.vocab = self.tokenizer.vocab_size
        self.words = (self.vocab + 31) // 32  # int32 words in one row's bitmask
        self._cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar of `constraint` (cached); ConstraintError naming the problem
        if the schema, regex or grammar is invalid, unsupported or unsatisfiable."""
        key = constraint.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        template = llg.LLMatcher(self.tokenizer, grammar_text(constraint), log_level=0)
        if template.is_error():
            raise ConstraintError(_clean(template.get_error()), constraint.param)
        compiled = CompiledGrammar(constraint, template, self.vocab, frozenset(self.eos_token_ids))
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher for one row (compiling on a cache miss)."""
        return self.compile(constraint).matcher()

    def cache_info(self) -> dict[str, int]:
        return {"size": len(self._cache), "capacity": self._cache_size}


def _clean(error: str) -> str:
    """llguidance's message without its grammar-source excerpt (it can echo the schema)."""
    return error.strip().split("\n   1 |")[0].strip()


_by_fingerprint: dict[str, GrammarCompiler] = {}
_by_object: "weakref.WeakKeyDictionary[Any, GrammarCompiler]" = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def compiler_for(tokenizer: Any) -> GrammarCompiler:
    """The process-wide compiler for `tokenizer`: built on first use (seconds), then shared by
    every tokenizer object with the same identity."""
    with _registry_lock:
        try:
            found = _by_object.get(tokenizer)
        except TypeError:  # not weak-referenceable: fall through to the fingerprint
            found = None
        if found is not None:
            return found
        fresh = GrammarCompiler(tokenizer)
        compiler = _by_fingerprint.setdefault(fresh.fingerprint, fresh)
        try:
            _by_object[tokenizer] = compiler
        except TypeError:
            pass
        return compiler
