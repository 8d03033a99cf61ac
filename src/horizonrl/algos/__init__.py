"""RL algorithm math as small pure functions on torch tensors, with no trainer state.

- :mod:`horizonrl.algos.advantages`: group-relative advantages (GRPO, Dr.GRPO) and their per-token broadcast.
- :mod:`horizonrl.algos.losses`: masked reductions, the clipped PPO surrogate (with DAPO clip-higher) and SFT.
- :mod:`horizonrl.algos.kl`: per-token KL estimators k1, k2, k3 against a reference policy.
"""

from __future__ import annotations

from horizonrl.algos import advantages, kl, losses

__all__ = ["advantages", "kl", "losses"]
