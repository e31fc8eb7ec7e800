"""The scheduling side of the engine: requests, admission, policies, the scheduler and its accounting.

Nothing here imports torch: the scheduler is a pure-Python policy over host data.
"""
