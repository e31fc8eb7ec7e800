"""The performance model: what a recorded engine trace would cost on a GPU with real model shapes.

Pure functions and figures, no experiment: ``hardware`` (device datasheets, model shapes, default
assumptions), ``projection`` (the roofline of one forward and of a whole trace), ``moe`` (the routed
experts an MoE call reads), ``host_model`` (host operations x seconds per operation),
``calibration_fit`` (constants fitted to measured seconds) and ``sensitivity`` (one uncertain constant
moved at a time). It imports neither torch nor the engine.
Every constant and its source: README.md beside this file.
"""
