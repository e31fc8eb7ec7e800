"""The Ray Serve door: the deployment (``serve_app``, Ray's part), its metrics (``serve_metrics``) and
API keys (``api_keys``), over the OpenAI server in :mod:`actors.serving.openai` (plain Python, no Ray
actor). Imports nothing, so ``import actors`` stays light."""
