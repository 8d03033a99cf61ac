"""Run configuration: one YAML file per recipe, validated by pydantic, overridable as ``key.sub=value``.

Every field is typed, has a visible default and a description: ``horizon config show CONFIG`` prints a
recipe resolved with each key's value, source and description, and docs/config.md is generated from
these models (``horizon config docs --out docs/config.md``). Unknown keys and bad values are errors
that name the key and what would be valid.

A section lives next to the code it configures where that code has a ``config.py`` (``agent:`` in
agent/config.py, ``env:`` in envs/config.py, ``engine:`` in engine/config.py, ``stream:`` in
stream/config.py, ...) and otherwise in a module of this package (``train:`` in train.py, ``eval:``
in eval.py, ...); :mod:`horizonrl.config.run` composes them into
:class:`RunConfig`, :mod:`horizonrl.config.algorithms` holds the ``train.algorithm`` presets, and
loading, overrides, dumping (secrets as references, :mod:`horizonrl.secret`) and explaining a recipe
are modules of their own. This module is the
package's public face: import from ``horizonrl.config``.
"""

from horizonrl.config.algorithms import (
    ALGORITHM_PRESETS,
    BASE_PRESET,
    DEFAULT_ALGORITHM,
    GROUP_ADVANTAGES,
    PRESET_FIELDS,
    SEQUENCE_ADVANTAGES,
    Advantage,
    Algorithm,
    AlgorithmPreset,
    Critic,
    GroupBaseline,
    KLPlacement,
    LossReduction,
    PolicyLoss,
    RewardPlacement,
)
from horizonrl.config.dpo import DPOConfig
from horizonrl.config.dump import dump_config, format_value, stored_config, write_config
from horizonrl.config.eval import EvalConfig
from horizonrl.config.explain import ConfigEntry, ConfigSource, explain_config
from horizonrl.config.load import format_validation_error, load_config, read_recipe
from horizonrl.config.optimizer import OptimizerSettings
from horizonrl.config.overrides import apply_overrides, parse_override
from horizonrl.config.rollout import RolloutConfig
from horizonrl.config.run import RunConfig
from horizonrl.config.sft import SFTConfig
from horizonrl.config.train import TrainConfig

__all__ = [
    "ALGORITHM_PRESETS",
    "BASE_PRESET",
    "DEFAULT_ALGORITHM",
    "GROUP_ADVANTAGES",
    "PRESET_FIELDS",
    "SEQUENCE_ADVANTAGES",
    "Advantage",
    "Algorithm",
    "AlgorithmPreset",
    "ConfigEntry",
    "ConfigSource",
    "Critic",
    "DPOConfig",
    "EvalConfig",
    "GroupBaseline",
    "KLPlacement",
    "LossReduction",
    "OptimizerSettings",
    "PolicyLoss",
    "RewardPlacement",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TrainConfig",
    "apply_overrides",
    "dump_config",
    "explain_config",
    "format_validation_error",
    "format_value",
    "load_config",
    "parse_override",
    "read_recipe",
    "stored_config",
    "write_config",
]
