"""The runner side of the engine: the persistent batch, a step's inputs for each layout, the decoding
rules, the memory model, and the runner that executes one step on the model.
"""
