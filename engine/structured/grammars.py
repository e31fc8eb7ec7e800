"""Compiling a request's ``structured_outputs`` with xgrammar, once per constraint, and what cannot be constrained.

xgrammar (vLLM's and SGLang's default) reads the model's tokenizer and compiles a constraint into a grammar
whose matcher gives, token by token, the bitmask of tokens that keep the text a valid prefix. JSON (a schema or
``json_object``) is compiled with no free whitespace and compact separators: with "any whitespace" allowed a
model can spend its whole budget on spaces. A choice is compiled as a grammar of string literals.

Compiling happens where a request is checked (``BlockServeEngine.tokenize``: the OpenAI server runs it in a
worker thread, the Ray Data actor compiles a batch's constraints in one before it submits the rows), so a slow
compile delays its own request and not the step loop; the engine's admission then finds the grammar in the
cache. The cache may be read and filled from several threads.
"""
from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from engine.models.loader import DiffusionLM
from engine.rules.base import DecodingRule
from engine.rules.unmasking import UnmaskingRule
from engine.structured.spec import GrammarSpec, grammar_spec
from engine.structured.vocabulary import Vocabulary, vocabulary

if TYPE_CHECKING:
    import xgrammar

CACHED_GRAMMARS = 256  # compiled grammars kept, least recently used dropped first
COMPACT_SEPARATORS = (",", ":")
_LIBRARY_PREFIX = re.compile(r"^\[[^\]]*\] \S+: ")  # xgrammar's "[time] file.cc:line: " before its message


class Grammars:
    """The compiled grammars of one engine's model, by constraint; the refusals of its model and rule."""

    def __init__(self, lm: DiffusionLM, rule: DecodingRule):
        self.lm, self.rule = lm, rule
        self._compiler: xgrammar.GrammarCompiler | None = None  # built on the first constrained request
        self._vocabulary: Vocabulary | None = None
        self._compiled: OrderedDict[tuple[str, str], xgrammar.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # guards the cache and the compiler's creation, never a compile

    def problem(self, params: Any) -> str | None:
        """Why ``params.structured_outputs`` cannot run on this engine, a message that starts with the field."""
        if params.structured_outputs is None:
            return None
        if self.refusal is not None:
            return self.refusal
        try:
            self.compiled(params)
        except ValueError as error:
            return str(error)
        return None

    @functools.cached_property
    def refusal(self) -> str | None:
        """Why no request may ask for structured output on this engine (None: constrained rows are defined)."""
        layout = self.lm.layout
        if layout.step_kind != "blocks":
            return (f"structured_outputs is not offered for {layout.family}: its {layout.row_kind} rows rewrite or "
                    "seed positions out of left-to-right order, so no grammar state is defined for them")
        if not isinstance(self.rule, UnmaskingRule):
            return (f"structured_outputs is not offered with decoding={self.rule.name!r}: only rules that commit "
                    "masked positions and never rewrite them keep a constrained answer a valid prefix")
        if self.lm.shard.is_split:
            return "structured_outputs is not offered on a model split over devices (tensor_parallel_size > 1)"
        return None

    def compiled(self, params: Any) -> xgrammar.CompiledGrammar | None:
        """The compiled grammar of ``params.structured_outputs`` (None: free text); ValueError naming the field."""
        if params.structured_outputs is None:
            return None
        spec = grammar_spec(params.structured_outputs)
        with self._lock:
            grammar = self._compiled.get(spec.key)
            if grammar is not None:
                self._compiled.move_to_end(spec.key)
                return grammar
        grammar = self._compile(spec)
        with self._lock:
            self._compiled[spec.key] = grammar
            while len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return grammar

    def _compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        import xgrammar

        with self._lock:
            compiler = self._compiler or self._new_compiler()
        try:
            grammar = spec_grammar(spec)
            if self._vocabulary.answer_prefix:
                prefix = xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(self._vocabulary.answer_prefix)}")
                grammar = xgrammar.Grammar.concat(prefix, grammar)
            return compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError, TypeError) as error:
            message = _LIBRARY_PREFIX.sub("", str(error).strip().splitlines()[0] if str(error).strip() else "")
            raise ValueError(f"structured_outputs.{spec.kind} does not compile: {message or type(error).__name__}") \
                from None

    def _new_compiler(self) -> xgrammar.GrammarCompiler:
        import xgrammar

        self._vocabulary = vocabulary(self.lm.tokenizer, self.lm.vocab_size, list(self.lm.special_ids.stop_ids))
        self._compiler = xgrammar.GrammarCompiler(self._vocabulary.info, max_threads=2, cache_enabled=False)
        return self._compiler


def spec_grammar(spec: GrammarSpec) -> xgrammar.Grammar:
    """The grammar of a constraint, before it meets a vocabulary (JSON with no free whitespace)."""
    import xgrammar

    if spec.kind in ("json", "json_object"):
        return xgrammar.Grammar.from_json_schema(spec.source or '{"type": "object"}', any_whitespace=False,
                                                 separators=COMPACT_SEPARATORS, strict_mode=True)
    if spec.kind == "regex":
        return xgrammar.Grammar.from_regex(spec.source)
    if spec.kind == "choice":
        return xgrammar.Grammar.from_ebnf(choice_grammar(json.loads(spec.source)))
    return xgrammar.Grammar.from_ebnf(spec.source)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose sentences are exactly ``choices`` (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)

