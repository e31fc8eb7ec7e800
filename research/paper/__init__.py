"""The paper's evaluation side by side on one model: ``python -m research paper``."""
