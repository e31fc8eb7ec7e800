"""How many routed experts an MoE forward reads: the weight bytes of its MoE layers.

A forward streams an expert's weights only if its router sent at least one token there. The count per
MoE layer comes from the replay (``model.experts_touched()`` of the replay model, recorded per forward)
or, without one, from uniform routing. Both rules are assumptions, stated in README.md beside this file:

* **Uniform routing.** If each of T tokens takes k of E experts uniformly at random, independently, an
  expert is missed by one token with probability 1 - k/E, so the expected distinct experts are
  E x (1 - (1 - k/E)^T). Real routers are not uniform: correlated tokens (a block of MASKs) share
  experts, so this tends to count more experts than a trained router reads.
* **Scaling a replay model's count.** A replay model with E' experts and k' per token that touched n'
  experts over T tokens is n' / uniform(T, E', k') times as spread as uniform routing. The real model
  is assumed to be as spread: ratio x uniform(T, E, k), at most E. When E' = E and k' = k this is n'.
"""
from __future__ import annotations


def expected_experts_touched(tokens: float, experts: int, per_token: int) -> float:
    """E x (1 - (1 - k/E)^T): distinct experts that T uniformly routed tokens read, in expectation."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - per_token / experts) ** tokens)


def scaled_experts_touched(observed: float, tokens: float, replay_experts: int, replay_per_token: int,
                           experts: int, per_token: int) -> float:
    """The replay model's distinct experts ``observed`` over ``tokens``, carried to a model of ``experts``
    with ``per_token`` each at the same spread relative to uniform routing (module docstring)."""
    uniform_replay = expected_experts_touched(tokens, replay_experts, replay_per_token)
    spread = observed / uniform_replay if uniform_replay else 1.0
    return min(float(experts), spread * expected_experts_touched(tokens, experts, per_token))
