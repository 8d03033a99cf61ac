"""A learning method is one selection rule, one optimizer and the component it changes
(AutoEnv's selection x optimization x target), written ``selection/optimization/target``."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

SELECTIONS = ("best", "pareto")
#: optimizer -> the targets it can change
OPTIMIZERS = {
    "dynamics": ("prompt", "agent_code"),
    "instruction": ("prompt", "agent_code"),
    "sft": ("model",),
    "grpo": ("model",),
}
TARGETS = ("prompt", "agent_code", "model")

#: AutoEnv's eight (2 selections x 2 optimizations x 2 targets), then the model methods
ALL_METHODS = tuple(
    [f"{s}/{o}/{t}" for t, o, s in product(("prompt", "agent_code"), ("dynamics", "instruction"), SELECTIONS)]
    + [f"best/{o}/model" for o in ("sft", "grpo")]
)


@dataclass(frozen=True)
class Method:
    selection: str
    optimization: str
    target: str

    @property
    def name(self) -> str:
        return f"{self.selection}/{self.optimization}/{self.target}"

    @property
    def slug(self) -> str:
        """The method's name as one directory name."""
        return self.name.replace("/", "-")


def valid_methods_line() -> str:
    pairs = "; ".join(f"{o} -> {'|'.join(ts)}" for o, ts in OPTIMIZERS.items())
    return f"selection/optimization/target with selection {'|'.join(SELECTIONS)} and {pairs}"


def parse_method(name: str) -> Method:
    """``best/dynamics/prompt`` -> Method; anything else is a ValueError naming the valid forms."""
    parts = name.split("/")
    if len(parts) != 3:
        raise ValueError(f"unknown method {name!r}; valid: {valid_methods_line()}, or 'all'")
    selection, optimization, target = parts
    if selection not in SELECTIONS:
        raise ValueError(f"method {name!r}: unknown selection {selection!r}; valid: {', '.join(SELECTIONS)}")
    if optimization not in OPTIMIZERS:
        raise ValueError(
            f"method {name!r}: unknown optimization {optimization!r}; valid: {', '.join(OPTIMIZERS)}"
        )
    if target not in OPTIMIZERS[optimization]:
        raise ValueError(
            f"method {name!r}: {optimization} cannot change {target!r}; it changes "
            f"{', '.join(OPTIMIZERS[optimization])} (valid: {valid_methods_line()})"
        )
    return Method(selection, optimization, target)
