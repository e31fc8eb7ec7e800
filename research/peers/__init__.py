"""Drivers that run the block-causal families' own reference code outside the project, and the comparison
of their outputs with ours (README.md)."""
