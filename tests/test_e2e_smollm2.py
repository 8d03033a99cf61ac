"""End to end with the real embedded SmolLM2-135M-Instruct: a rollout through the CLI writes
records whose model-token logprobs match a teacher-forced recomputation by the same model, which
proves prompt_ids + response_ids is exactly the sequence sampled (no re-tokenization drift)."""

import pytest
import torch

from horizonrl.cli import app
from horizonrl.model_config import ModelConfig
from horizonrl.models import load_model
from horizonrl.types import read_trajectories

pytestmark = pytest.mark.slow


def test_rollout_with_real_smollm2_records_the_sampled_tokens(tmp_path):
    from typer.testing import CliRunner

    out = tmp_path / "r.jsonl"
    overrides = [
        "model.dtype=float32",  # the teacher-forced check below runs in float32 (the demo samples in bf16)
        "engine.dtype=float32",
        "agent.max_turns=2",
        "sampling.max_new_tokens=24",
        "sampling.temperature=1.0",
        "rollout.concurrency=2",
    ]
    result = CliRunner().invoke(
        app, ["rollout", "configs/calc.yaml", *overrides, "--n", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out)
    assert len(trajs) == 2
    model, _ = load_model(ModelConfig())
    for traj in trajs:
        assert traj.num_turns >= 1 and sum(traj.loss_mask) > 0
        seq = torch.tensor([traj.prompt_ids + traj.response_ids])
        with torch.inference_mode():
            logits = model(seq).logits[0].float()
        start = len(traj.prompt_ids)
        logp = torch.log_softmax(logits[start - 1 : -1], dim=-1)  # sampled at temperature 1.0
        recomputed = logp.gather(1, torch.tensor(traj.response_ids)[:, None])[:, 0]
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        recorded = torch.tensor(traj.logprobs)
        assert torch.allclose(recomputed[mask], recorded[mask], atol=2e-3), (
            (recomputed[mask] - recorded[mask]).abs().max()
        )
        assert (recorded[~mask] == 0).all()


def test_one_grpo_group_and_update_on_real_smollm2_moves_the_lora_weights():
    """One GRPO group on the real model: two episodes sampled by SmolLM2 plus two scripted-oracle
    episodes of the same task (so the group's rewards differ and advantages are non-zero), then one
    update with KL to the starting policy. The LoRA weights move, the base weights do not, and the
    loss, gradient norm and KL are finite."""
    import asyncio

    from horizonrl.config import load_config
    from horizonrl.envs.calc import CalcEnv
    from horizonrl.envs.factory import env_factory, make_tasks
    from horizonrl.optim import make_optimizer
    from horizonrl.rollout.runner import run_rollouts
    from horizonrl.train.runtime import build_runtime
    from horizonrl.train.update import train_step
    from horizonrl.trainable import wrap_lora

    cfg = load_config(
        "configs/calc.yaml",
        [
            "agent.max_turns=2",
            "env.options.min_ops=1",
            "env.options.max_ops=1",
            "sampling.max_new_tokens=48",
            "train.algorithm=dr_grpo",  # one GRPO group, without the recipe's demonstration term
            "train.demo_coef=0",
            "train.kl_coef=0.05",
            "train.group_size=4",
            "engine.dtype=auto",  # the test trains the engine's own model: the exact sampler's
        ],
    )
    runtime = build_runtime(cfg)
    task = make_tasks(cfg.env, "train", 1, 7)[0]
    factory = env_factory(cfg.env)
    sampled = asyncio.run(run_rollouts(runtime.agent, factory, [task], 2, 2))
    oracle = asyncio.run(run_rollouts(runtime.agent, factory, [task], 2, 2, policy=CalcEnv.oracle()))
    oracle = [t.model_copy(update={"id": f"oracle-{t.id}"}) for t in oracle]
    group = list(sampled) + oracle
    assert {t.group_id for t in group} == {task.id}
    assert all(t.success for t in oracle)

    policy = wrap_lora(runtime.model, cfg.model.lora)
    optimizer, scheduler = make_optimizer(policy, 1e-3, 0.0, 0)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    metrics = train_step(policy, optimizer, scheduler, group, cfg.train, runtime.tokenizer.pad_token_id)
    for key in ("loss", "grad_norm", "kl"):
        assert torch.isfinite(torch.tensor(metrics[key])), metrics
    assert metrics["update_skipped"] == 0.0 and metrics["grad_norm"] > 0
    lora = [n for n in before if "lora_" in n]
    moved = [n for n in lora if not torch.equal(before[n], dict(policy.named_parameters())[n])]
    assert lora and len(moved) >= len(lora) // 2, (len(moved), len(lora))
    frozen = [n for n in before if "lora_" not in n]
    params = dict(policy.named_parameters())
    assert all(torch.equal(before[n], params[n]) for n in frozen)
