"""A gymnasium env with text observations, written for gymnasium and nothing else: walk along a row
of cells to the target. Importing this file registers it as ``CellWalk-v0``; HorizonRL runs it as it
is (``env.name: gymnasium:examples/gymnasium_envs/cellwalk.py:CellWalk-v0``, see
configs/gymnasium_cellwalk.yaml).

Observation: one line of text saying where the walker and the target are. Action: ``Discrete(3)``,
named ``left``, ``stay``, ``right`` (``metadata["action_names"]``). Reward 1 on reaching the target
(the episode ends there), 0 otherwise; truncated after ``max_steps``.
"""

from __future__ import annotations

import string

import gymnasium as gym
from gymnasium import spaces


class CellWalkEnv(gym.Env):
    metadata = {"render_modes": [], "action_names": ["left", "stay", "right"]}

    def __init__(self, size: int = 7, max_steps: int = 8) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Discrete(3)
        self.pos = self.target = self.steps = 0

    def _observation(self) -> str:
        return (
            f"You are at cell {self.pos} of a row of cells 0 to {self.size - 1}; the target is at cell "
            f"{self.target}. Move left, right or stay."
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(self.size))
        self.pos = self.target
        while self.pos == self.target:
            self.pos = int(self.np_random.integers(self.size))
        self.steps = 0
        return self._observation(), {"distance": abs(self.pos - self.target)}

    def step(self, action: int) -> tuple[str, float, bool, bool, dict]:
        self.steps += 1
        self.pos = min(self.size - 1, max(0, self.pos + int(action) - 1))
        hit = self.pos == self.target
        info = {"is_success": hit, "distance": abs(self.pos - self.target)}
        return self._observation(), float(hit), hit, self.steps >= self.max_steps, info


gym.register("CellWalk-v0", entry_point=CellWalkEnv)
