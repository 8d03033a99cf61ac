"""The one policy builder (`horizonrl.trainable.build_policy`): what it builds, and that every
trainer's policy comes from it, so `model.gradient_checkpointing` reaches the module each trains —
`horizon train`'s SFT stage and RL policy, and a data-parallel trainer rank's copy of it."""

from __future__ import annotations

import copy

import pytest
import torch
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import TrainConfig, load_config
from horizonrl.model_config import ModelConfig
from horizonrl.train import sft as sft_module
from horizonrl.train import step_loop as step_module
from horizonrl.trainable import build_policy

TINY = ModelConfig(path="tiny-random")
CALC = "configs/calc.yaml"
TINY_RUN = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=12",
    "agent.max_turns=5",
    "eval.num_tasks=2",
    "sft.num_demos=2",
    "sft.batch_size=2",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "train.steps=1",
]


def checkpointing(model) -> bool:
    """Whether transformers' gradient (activation) checkpointing is on for ``model``."""
    flag = "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else None
    return bool(getattr(model, flag or "is_gradient_checkpointing"))


def _base(tiny_model_and_tokenizer):
    return copy.deepcopy(tiny_model_and_tokenizer[0])  # the builder changes its base in place


@pytest.mark.parametrize("on", [True, False])
def test_the_builder_applies_gradient_checkpointing_exactly_when_asked(tiny_model_and_tokenizer, on):
    cfg = TINY.model_copy(update={"gradient_checkpointing": on})
    for finetune in ("lora", "full"):
        built = build_policy(_base(tiny_model_and_tokenizer), cfg.model_copy(update={"finetune": finetune}))
        assert checkpointing(built.model) is on, finetune
        layers = built.model.get_decoder().layers
        assert all(layer.gradient_checkpointing is on for layer in layers), finetune
        assert built.model.training


def test_the_builder_makes_lora_or_full_with_value_head_and_optimizer(tiny_model_and_tokenizer):
    train = TrainConfig(algorithm="ppo", lr=3e-4, weight_decay=0.01, warmup_steps=4)
    seed = 12345
    built = build_policy(
        _base(tiny_model_and_tokenizer), TINY, optim=train, critic=train.critic, init_seed=seed
    )
    trained = [n for n, p in built.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert set(built.modules) == {"value_head"}
    optimized = {id(p) for group in built.optimizer.param_groups for p in group["params"]}
    head = list(built.modules["value_head"].parameters())
    assert optimized == {id(p) for p in built.model.parameters() if p.requires_grad} | {id(p) for p in head}
    group = built.optimizer.param_groups[0]
    assert group["weight_decay"] == 0.01 and built.scheduler.get_last_lr() == [3e-4 / 4]
    again = build_policy(_base(tiny_model_and_tokenizer), TINY, critic="value_head", init_seed=seed)
    assert again.optimizer is None and again.scheduler is None  # the caller's trainer makes its own
    for (name, a), (_, b) in zip(built.model.named_parameters(), again.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name  # the init depends on the seed alone
    full = build_policy(_base(tiny_model_and_tokenizer), TINY.model_copy(update={"finetune": "full"}))
    assert all(p.requires_grad for p in full.model.parameters()) and not full.modules
    with pytest.raises(ValueError, match="critic"):
        build_policy(_base(tiny_model_and_tokenizer), TINY, critic="critic")


@pytest.mark.parametrize("on", [True, False])
def test_horizon_train_trains_with_gradient_checkpointing_exactly_when_configured(tmp_path, monkeypatch, on):
    """`model.gradient_checkpointing` reaches the module `horizon train` trains: the SFT stage's model
    and the RL policy of every update (it used to reach only `load_model`'s)."""
    seen: dict[str, list[bool]] = {"sft": [], "rl": []}
    real_sft, real_step = sft_module.train_sft, step_module.train_step

    def spy_sft(model, *args, **kwargs):
        seen["sft"].append(checkpointing(model))
        return real_sft(model, *args, **kwargs)

    def spy_step(model, *args, **kwargs):
        seen["rl"].append(checkpointing(model))
        return real_step(model, *args, **kwargs)

    monkeypatch.setattr(sft_module, "train_sft", spy_sft)
    monkeypatch.setattr(step_module, "train_step", spy_step)
    args = ["train", CALC, *TINY_RUN, f"model.gradient_checkpointing={str(on).lower()}"]
    result = CliRunner().invoke(app, [*args, f"output_dir={tmp_path}", "name=run"])
    assert result.exit_code == 0, result.output
    assert seen == {"sft": [on], "rl": [on]}


@pytest.mark.parametrize("on", [True, False])
def test_a_trainer_rank_builds_the_drivers_policy_with_its_checkpointing(tmp_path, on):
    """A data-parallel rank (the body of a Ray actor, run here without Ray) builds its policy with the
    builder from the recipe, so it checkpoints as the driver's does and starts from its weights."""
    from horizonrl.models import load_base
    from horizonrl.runtime.trainer import TrainerRank, policy_fingerprint, trainable_state
    from horizonrl.train.run import TrainingRun
    from horizonrl.train.workers import TrainerRecipe

    overrides = [*TINY_RUN, f"model.gradient_checkpointing={str(on).lower()}", f"output_dir={tmp_path}"]
    config = load_config(CALC, overrides)
    driver = TrainingRun(config)
    loaded = load_base(config.model)
    driver.base, driver.tokenizer = loaded.base, loaded.tokenizer
    driver._wrap_policy()  # the driver's own build of its RL policy
    assert checkpointing(driver.policy) is on
    threads = torch.get_num_threads()
    try:
        rc = config.runtime
        rank = TrainerRank(
            TrainerRecipe(config.model_dump(mode="json")), 0, 1, rc.trainer_cpus, rc.trainer_gpus
        )
        fingerprint = rank.load(
            [],
            trainable_state(driver.policy, driver.modules),
            driver.optimizer.state_dict(),
            driver.scheduler.state_dict(),
        )
    finally:
        torch.set_num_threads(threads)  # the rank sets its actor's thread count
    assert checkpointing(rank.policy) is on
    assert fingerprint == policy_fingerprint(driver.policy, driver.modules)
