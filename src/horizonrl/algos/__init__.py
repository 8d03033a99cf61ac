"""RL algorithm math as small pure functions on torch tensors, with no trainer state.

- :mod:`horizonrl.algos.advantages`: group-relative advantages (GRPO, Dr.GRPO, RLOO), REINFORCE++
  returns and whitening, and their per-token broadcast.
- :mod:`horizonrl.algos.losses`: masked reductions, the clipped PPO surrogate (with DAPO clip-higher
  and dual clip), GSPO, plain importance sampling, truncated importance weights, SFT and DPO.
- :mod:`horizonrl.algos.kl`: per-token KL estimators k1, k2, k3 against a reference policy.
- :mod:`horizonrl.algos.critic`: PPO's critic — the value head, GAE and the clipped value loss.
"""

from __future__ import annotations

from horizonrl.algos import advantages, critic, kl, losses

__all__ = ["advantages", "critic", "kl", "losses"]
