"""Config loading: YAML + dotted overrides, errors that name the key and the valid choices."""

from pathlib import Path
from typing import get_args

import pytest
import yaml
from pydantic import ValidationError

from horizonrl.config import (
    ALGORITHM_PRESETS,
    DEFAULT_ALGORITHM,
    PRESET_FIELDS,
    Algorithm,
    AlgorithmPreset,
    DPOConfig,
    OptimizerSettings,
    SFTConfig,
    TrainConfig,
    apply_overrides,
    dump_config,
    explain_config,
    format_value,
    load_config,
)
from horizonrl.errors import ConfigError, UnknownEnvError

CALC = "configs/calc.yaml"


def test_calc_recipe_loads_and_round_trips(tmp_path):
    cfg = load_config(CALC)
    assert cfg.env.name == "calc" and cfg.model.path == "smollm2-135m"
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


def test_overrides_set_typed_values():
    cfg = load_config(
        CALC,
        ["agent.max_turns=3", "sampling.temperature=0.5", "sampling.stop=['</tool_call>']", "name=my-run"],
    )
    assert cfg.agent.max_turns == 3 and cfg.sampling.temperature == 0.5
    assert cfg.sampling.stop == ("</tool_call>",)
    assert cfg.name == "my-run"


def test_unknown_key_names_it_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown key 'agent\.max_turn'.*Did you mean 'agent\.max_turns'"):
        load_config(CALC, ["agent.max_turn=3"])


def test_bad_value_names_key_and_value():
    with pytest.raises(ConfigError, match=r"agent\.max_turns.*got 'many'"):
        load_config(CALC, ["agent.max_turns=many"])
    with pytest.raises(ConfigError, match=r"sampling\.top_p"):
        load_config(CALC, ["sampling.top_p=1.5"])


def test_the_renamed_conversation_cache_budget_names_its_new_key(tmp_path):
    recipe = yaml.safe_load(Path(CALC).read_text())
    recipe["engine"]["prefix_cache_tokens"] = 100
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(recipe))
    for path, overrides in ((CALC, ["engine.prefix_cache_tokens=100"]), (old, [])):
        with pytest.raises(
            ConfigError, match=r"prefix_cache_tokens is now engine\.prefix_cache_mib, a budget in MiB"
        ):
            load_config(path, overrides)
    assert load_config(CALC, ["engine.prefix_cache_mib=96"]).engine.prefix_cache_mib == 96


def test_unknown_env_lists_registered_envs():
    with pytest.raises(
        UnknownEnvError, match=r"unknown env 'calcc'.*Did you mean 'calc'.*Registered envs: .*calc"
    ):
        load_config(CALC, ["env.name=calcc"])


def test_bad_env_option_and_split_named():
    with pytest.raises(ConfigError, match=r"env\.options\.nope"):
        load_config(CALC, ["env.options.nope=1"])
    with pytest.raises(ConfigError, match=r"eval\.split.*valid: train, test"):
        load_config(CALC, ["eval.split=validation"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        apply_overrides({}, ["agent.max_turns"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


# ------------------------------------------------------------------ algorithm presets
PRESET_COLUMNS = (
    "advantage",
    "norm_by_std",
    "policy_loss",
    "clip_low",
    "clip_high",
    "reduction",
    "kl_in",
    "critic",
    "dynamic_sampling",
    "overlong_filter",
    "reward_placement",
    "group_baseline",
)
FINAL = ("final", "episode")  # reward_placement, group_baseline of every preset without turn credit
#: What each preset resolved to before the presets were written out in full (the values runs used).
RESOLVED_PRESETS = {
    "grpo": ("grpo", True, "ppo_clip", 0.2, 0.28, "token_mean", "loss", "none", False, False, *FINAL),
    "dr_grpo": (
        *("grpo", False, "ppo_clip", 0.2, 0.2, "seq_mean_token_sum", "loss", "none", False, False),
        *FINAL,
    ),
    "dapo": ("grpo", True, "ppo_clip", 0.2, 0.28, "token_mean", "loss", "none", True, True, *FINAL),
    "rloo": ("rloo", True, "ppo_clip", 0.2, 0.2, "token_mean", "loss", "none", False, False, *FINAL),
    "reinforce_pp": (
        *("reinforce_pp", True, "ppo_clip", 0.2, 0.2, "token_mean", "reward", "none", False, False),
        *FINAL,
    ),
    "reinforce_pp_baseline": (
        *("reinforce_pp_baseline", True, "ppo_clip", 0.2, 0.2, "token_mean", "reward", "none"),
        *(False, False, *FINAL),
    ),
    # reinforce_pp_baseline with the overrides the calc runs with turn credit were measured with
    "reinforce_pp_turn": (
        *("reinforce_pp_baseline", True, "ppo_clip", 0.2, 0.2, "seq_mean_token_sum", "reward", "none"),
        *(False, False, "per_turn", "turn"),
    ),
    "ppo": ("gae", True, "ppo_clip", 0.2, 0.2, "token_mean", "loss", "value_head", False, False, *FINAL),
    "gspo": ("grpo", True, "gspo", 3e-4, 4e-4, "seq_mean_token_mean", "loss", "none", False, False, *FINAL),
}


def test_every_algorithm_has_a_complete_preset():
    assert list(ALGORITHM_PRESETS) == list(get_args(Algorithm))
    assert set(PRESET_COLUMNS) == set(PRESET_FIELDS)
    for name, preset in ALGORITHM_PRESETS.items():
        assert set(preset.values()) == set(PRESET_FIELDS), name
        assert preset.about, name
    with pytest.raises(ValidationError, match="clip_high"):  # a preset cannot leave a field out
        AlgorithmPreset(**ALGORITHM_PRESETS["grpo"].model_dump(exclude={"clip_high"}))


@pytest.mark.parametrize("algorithm", list(RESOLVED_PRESETS))
def test_presets_resolve_to_the_values_runs_used(algorithm):
    cfg = TrainConfig(algorithm=algorithm)
    assert tuple(getattr(cfg, f) for f in PRESET_COLUMNS) == RESOLVED_PRESETS[algorithm]
    assert ALGORITHM_PRESETS[algorithm].values() == dict(
        zip(PRESET_COLUMNS, RESOLVED_PRESETS[algorithm], strict=True)
    )
    recipe = load_config(CALC, [f"train.algorithm={algorithm}"]).train
    assert recipe.clip_high == RESOLVED_PRESETS[algorithm][4]


def test_preset_field_defaults_are_the_default_algorithms():
    defaults = {f: TrainConfig.model_fields[f].default for f in PRESET_FIELDS}
    assert defaults == ALGORITHM_PRESETS[DEFAULT_ALGORITHM].values()
    assert TrainConfig.model_fields["algorithm"].default == DEFAULT_ALGORITHM == "grpo"
    for field in PRESET_FIELDS:
        assert TrainConfig.model_fields[field].description.startswith("(preset)"), field


def test_explicit_keys_win_over_the_preset_and_null_means_the_preset():
    cfg = load_config(CALC, ["train.algorithm=gspo", "train.clip_high=0.5", "train.reduction=token_mean"])
    assert cfg.train.clip_high == 0.5 and cfg.train.reduction == "token_mean"
    assert cfg.train.clip_low == 3e-4 and cfg.train.policy_loss == "gspo"  # the rest from the preset
    assert TrainConfig(algorithm="dr_grpo", clip_high=None).clip_high == 0.2
    assert TrainConfig(algorithm="dapo", dynamic_sampling=False).dynamic_sampling is False


def test_an_impossible_preset_combination_names_the_key():
    with pytest.raises(ConfigError, match=r"train\.advantage='gae' needs a critic"):
        load_config(CALC, ["train.algorithm=ppo", "train.critic=none"])
    with pytest.raises(ConfigError, match=r"train\.algorithm.*'grpo'"):
        load_config(CALC, ["train.algorithm=grpoo"])


# ------------------------------------------------------------------ optimizer settings, declared once
def test_sft_dpo_and_train_share_one_optimizer_section():
    shared = tuple(OptimizerSettings.model_fields)
    assert shared == ("lr", "weight_decay", "warmup_steps", "max_grad_norm", "micro_batch_tokens")
    for section in (SFTConfig, DPOConfig, TrainConfig):
        assert issubclass(section, OptimizerSettings)
        for key in shared:
            field, base = section.model_fields[key], OptimizerSettings.model_fields[key]
            assert field.description == base.description and field.metadata == base.metadata, (section, key)
    assert (SFTConfig().lr, SFTConfig().warmup_steps) == (1e-3, 2)  # the section's own defaults
    assert (DPOConfig().lr, DPOConfig().warmup_steps) == (1e-4, 0)
    assert (TrainConfig().lr, TrainConfig().micro_batch_tokens) == (1e-4, 4096)


@pytest.mark.parametrize("key", ["sft.lr=0", "dpo.weight_decay=-1", "train.micro_batch_tokens=8"])
def test_optimizer_bounds_hold_in_every_section(key):
    with pytest.raises(ConfigError, match=key.split("=")[0].replace(".", r"\.")):
        load_config(CALC, [key])


# ------------------------------------------------------------------ a recipe explained key by key
def test_explain_config_gives_every_key_its_source():
    entries = {e.key: e for e in explain_config(CALC, ["train.algorithm=ppo", "train.clip_high=0.3"])}
    assert entries["train.algorithm"].source == "override" and entries["train.algorithm"].value == "ppo"
    assert entries["train.clip_high"].source == "override" and entries["train.clip_high"].value == 0.3
    assert entries["train.advantage"].source == "preset" and entries["train.advantage"].value == "gae"
    assert entries["train.lr"].source == "file" and entries["train.lr"].value == 5e-4
    assert entries["train.entropy_coef"].source == "default"
    assert entries["model.lora.r"].source == "default"  # nested sections, key by key
    assert entries["env.options.step_credit"].source == "file"  # the env's options, as it reads them
    assert entries["env.options.max_digits"].source == "default"
    assert entries["sft.lr"].description == "AdamW learning rate."
    flat = load_config(CALC, ["train.algorithm=ppo", "train.clip_high=0.3"]).model_dump(mode="json")
    for key, entry in entries.items():
        if not key.startswith("env.options."):
            node = flat
            for part in key.split("."):
                node = node[part]
            assert node == entry.value, key


def test_format_value_writes_values_as_overrides_read_them():
    for value in (None, True, 0.0005, 3, "calc", "null", "1.0", [1, "a"], {}):
        assert yaml.safe_load(format_value(value)) == value
    assert format_value(None) == "null" and format_value("calc") == "calc"
