"""Research experiments: the paper's evaluation, projections of other models and the peers' own code.

Not part of the product and not in the wheel. They may import ``benchmarks`` and ``engine``; nothing
in ``benchmarks`` or the engine imports them. ``research/README.md`` says what each one is.
"""
