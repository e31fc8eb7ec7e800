"""Tensor parallel: one model split over ``tensor_parallel_size`` devices, one engine process per device.

``shard`` says what one rank holds and runs the forward's collectives, ``weights`` cuts a checkpoint's
tensors to a rank's share, and ``ranks`` starts and drives the worker ranks of an engine (``worker`` is their
loop). The layers that call the collectives are the layer kit's (``engine.layers``)."""
