"""The batch inference job on Ray Data: ``python -m pipeline.run --config configs/<name>.yaml``."""
