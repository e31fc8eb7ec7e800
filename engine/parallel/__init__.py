"""Tensor parallel: one model split over ``tensor_parallel_size`` devices, one engine process per device.

``shard`` says what one rank holds and runs the forward's collectives, and ``ranks`` starts and talks to the worker
ranks of an engine (``worker`` is their loop), for the executor that drives them (``engine.executor``). The layers
that call the collectives and cut a checkpoint's tensors to a rank's share are the layer kit's (``engine.layers``)."""
