"""The shipped tiny model: its tasks, its character tokenizer and its training recipe."""
