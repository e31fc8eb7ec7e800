"""The shipped tiny model: its tasks (they own its vocabulary), its word-level tokenizer and its
training recipe."""
