"""The runner side of the engine: the persistent batch, a step's inputs for each layout, the memory model,
and the runners that execute one step on the model (``engine.runner.interface``).
"""
