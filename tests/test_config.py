"""Config loading: YAML + dotted overrides, errors that name the key and the valid choices."""

import pytest

from horizonrl.config import apply_overrides, dump_config, load_config
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
