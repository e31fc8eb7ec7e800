"""Structured output: answers that must match a JSON schema, a regex, one of some choices or a grammar.

``spec`` reads a request's ``structured_outputs`` (vLLM's names) without a grammar library; ``grammars``
compiles it with xgrammar for the model's tokenizer and refuses what cannot be constrained; ``rows`` is what
the block rows do each step for a constrained row (``docs/structured_output.md`` has the design).
"""
