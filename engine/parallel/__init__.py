"""Tensor parallel: one model split over ``tensor_parallel_size`` devices, one engine process per device.

``shard`` says what one rank holds and runs the forward's collectives, ``weights`` cuts a checkpoint's
tensors to a rank's share, ``vocab`` holds the vocabulary-split embedding and head, and ``ranks`` starts
and drives the worker ranks of an engine (``worker`` is their loop)."""
