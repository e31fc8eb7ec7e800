"""Diffusion LMs people will try that this engine does not serve: refused by name, not as "unknown"."""
from __future__ import annotations


def unserved_diffusion_model(config: dict) -> str | None:
    """The name of a known diffusion LM this engine does not serve, if ``config`` is one."""
    architectures = [str(a) for a in config.get("architectures") or []]
    model_type = str(config.get("model_type", ""))
    names = " ".join([*architectures, model_type]).lower()
    if model_type == "llada2_moe_veomni":
        return "LLaDA2 in dFactory's merged-experts layout (model_type 'llada2_moe_veomni')"
    if "SDARMoeForCausalLM" in architectures or model_type == "sdar_moe":
        return "SDAR-MoE (SDARMoeForCausalLM)"
    if "nemotron" in names and "diffusion" in names and "NemotronLabsDiffusionModel" not in architectures:
        return (f"a Nemotron diffusion variant ({', '.join(architectures) or model_type}); of that family only "
                "the text model NemotronLabsDiffusionModel is served")
    return None
