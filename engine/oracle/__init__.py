"""Single-request oracles: each family's decoding written as one loop over one request, which the
batched engine must equal token for token. Tests, evaluation and benchmarks read them; the engine never does.
"""
