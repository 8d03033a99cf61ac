"""The algorithm suite in the trainer: every ``train.algorithm`` preset updates a tiny model from the
same batch, the batch-shaping options do what they say (overlong filtering, per-turn rewards, KL in
the reward, truncated importance weights, several optimizer steps per batch), config validation
names the valid choices, and DAPO dynamic sampling, ``--start-from`` and ``horizon compare`` work end
to end on the tiny model and the toy ``coin`` env."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import toy_envs  # noqa: F401 - registers the coin env
from builders import TINY_COIN, make_traj, params_copy, same_params, two_groups
from typer.testing import CliRunner

from horizonrl.algos.critic import make_value_head
from horizonrl.cli import app
from horizonrl.config import ALGORITHM_PRESETS, TrainConfig, load_config
from horizonrl.errors import ConfigError, TrainingError
from horizonrl.model_config import LoraSettings
from horizonrl.optim import make_optimizer
from horizonrl.train.advantages import group_advantages, weigh_negatives
from horizonrl.train.token_advantages import token_rewards
from horizonrl.train.tracking import read_metrics
from horizonrl.train.update import train_step
from horizonrl.trainable import wrap_lora
from horizonrl.types import read_trajectories

runner = CliRunner()


def batch(finish_last: str = "finished"):
    return two_groups(finish_last)


def fresh(tiny_model_and_tokenizer, lora: bool = False):
    model = copy.deepcopy(tiny_model_and_tokenizer[0])
    if lora:
        return wrap_lora(model, LoraSettings())
    return model.requires_grad_(True)


@pytest.mark.parametrize("algorithm", list(ALGORITHM_PRESETS))
def test_every_algorithm_updates_the_policy_from_one_batch(tiny_model_and_tokenizer, algorithm):
    model = fresh(tiny_model_and_tokenizer)
    cfg = TrainConfig(algorithm=algorithm, group_size=3, lr=1e-2, autocast="none")
    head = make_value_head(model) if cfg.critic == "value_head" else None
    optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0, [head] if head else [])
    before = params_copy(model)
    metrics = train_step(model, optimizer, scheduler, batch(), cfg, pad_id=0, value_head=head)
    assert metrics["update_skipped"] == 0.0 and metrics["trained_trajectories"] == 6
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert not same_params(model, before), "the weights did not move"
    if head is not None:
        assert metrics["vf_loss"] > 0 and head.linear.weight.abs().sum() > 0, "the critic did not learn"


def test_presets_resolve_and_explicit_fields_win():
    assert TrainConfig(algorithm="dr_grpo").norm_by_std is False
    assert TrainConfig(algorithm="dr_grpo").reduction == "seq_mean_token_sum"
    assert (
        TrainConfig(algorithm="ppo").advantage == "gae"
        and TrainConfig(algorithm="ppo").critic == "value_head"
    )
    assert TrainConfig(algorithm="dapo").dynamic_sampling is True
    assert TrainConfig(algorithm="gspo", clip_high=0.001).clip_high == 0.001
    assert TrainConfig(algorithm="rloo", reduction="seq_mean_token_mean").reduction == "seq_mean_token_mean"


def test_several_optimizer_steps_per_batch_use_the_old_policy_ratio(tiny_model_and_tokenizer):
    model = fresh(tiny_model_and_tokenizer)
    cfg = TrainConfig(group_size=3, lr=5e-2, autocast="none", ppo_epochs=2, mini_batches=2)
    optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0)
    metrics = train_step(model, optimizer, scheduler, batch(), cfg, pad_id=0, seed=3)
    assert metrics["optimizer_steps"] == 4
    # after the first step the policy moved away from the one that made the old logprobs
    assert metrics["ratio_max"] != pytest.approx(1.0)


@pytest.mark.parametrize(("epochs", "later_only"), [(1, True), (2, False)])
def test_the_no_grad_pass_covers_only_trajectories_trained_after_a_step(
    tiny_model_and_tokenizer, monkeypatch, epochs, later_only
):
    """With two mini-batches the first is trained before any step (its old logprobs are its current
    ones), so the pass before the update runs over the second only; with two epochs every trained
    trajectory is seen again after a step and needs it."""
    from horizonrl.train import update as update_module

    seen: list[list[str]] = []
    real = update_module.old_outputs

    def recording(model, trajs, *args, **kwargs):
        seen.append([t.id for t in trajs])
        return real(model, trajs, *args, **kwargs)

    monkeypatch.setattr(update_module, "old_outputs", recording)
    model = fresh(tiny_model_and_tokenizer)
    cfg = TrainConfig(group_size=3, lr=5e-2, autocast="none", ppo_epochs=epochs, mini_batches=2)
    optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0)
    metrics = train_step(model, optimizer, scheduler, batch(), cfg, pad_id=0, seed=3)
    assert metrics["optimizer_steps"] == 2 * epochs and metrics["trained_trajectories"] == 6
    assert len(seen) == 1
    assert len(seen[0]) == (3 if later_only else 6)
    if later_only:  # the first step left the second mini-batch's ratios off 1: its old logprobs are real
        assert metrics["ratio_max"] != pytest.approx(1.0)


def test_the_no_grad_pass_shares_the_prompt_prefix_and_matches_a_full_forward(
    tiny_model_and_tokenizer, monkeypatch
):
    from horizonrl.train import logprobs as lp_module
    from horizonrl.train.batching import collate
    from horizonrl.train.logprobs import old_outputs, token_logprobs

    model = fresh(tiny_model_and_tokenizer, lora=True)
    system = list(range(100, 140))  # 40 tokens every trajectory shares: computed once
    trajs = [
        make_traj("a", [*system, 11, 12], [14, 15, 16], mask=[1, 0, 1]),
        make_traj("b", [*system, 21], [23, 24, 25, 26]),
        make_traj("c", [*system, 31, 32, 33], [35]),
    ]
    prefixes = []
    real = lp_module.SharedPrefix
    monkeypatch.setattr(lp_module, "SharedPrefix", lambda *a: prefixes.append(a[1]) or real(*a))
    found = old_outputs(model, trajs, pad_id=0, max_tokens=64, with_reference=True)
    assert prefixes == [system, system]  # once under the policy, once under the reference
    with torch.no_grad():
        for name, ref in (("old_logprobs", False), ("ref_logprobs", True)):
            for traj, row in zip(trajs, found[name], strict=True):
                batch = collate([traj], pad_id=0)
                if ref:
                    with model.disable_adapter():
                        full, _ = token_logprobs(model, batch)
                else:
                    full, _ = token_logprobs(model, batch)
                p = len(traj.prompt_ids)
                expected = full[0, p - 1 : p - 1 + len(traj.response_ids)]
                torch.testing.assert_close(torch.tensor(row), expected, atol=1e-5, rtol=0)


def test_overlong_trajectories_leave_the_loss_but_stay_in_the_baseline(tiny_model_and_tokenizer):
    model = fresh(tiny_model_and_tokenizer)
    cfg = TrainConfig(algorithm="dapo", group_size=3, autocast="none")
    optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0)
    metrics = train_step(model, optimizer, scheduler, batch("context_overflow"), cfg, pad_id=0)
    assert metrics["overlong_filtered"] == 1 and metrics["trained_trajectories"] == 5
    off = TrainConfig(algorithm="dapo", group_size=3, autocast="none", overlong_filter=False)
    metrics = train_step(model, optimizer, scheduler, batch("context_overflow"), off, pad_id=0)
    assert metrics["overlong_filtered"] == 0 and metrics["trained_trajectories"] == 6


def test_per_turn_rewards_sit_at_each_turns_last_model_token_and_add_up_to_the_episode_reward():
    traj = make_traj("t", [1], [5, 6, 7, 8, 9, 10], mask=[1, 1, 0, 0, 1, 0], reward=1.0)
    traj.turn_rewards = [0.25, 0.75]  # the episode reward is the sum of its turns' rewards
    assert token_rewards(traj, "final") == [0, 0, 0, 0, 1.0, 0]
    assert token_rewards(traj, "per_turn") == [0, 0.25, 0, 0, 0.75, 0]
    traj.turn_rewards = [0.25, 0.0]  # an outcome of 1.0 from evaluate(): the rest sits at the end
    assert token_rewards(traj, "per_turn") == [0, 0.25, 0, 0, 0.75, 0]
    traj.reward = 0.0  # step credit the env took back (calc's credit_needs_attempt)
    rewards = token_rewards(traj, "per_turn")
    assert rewards == [0, 0.25, 0, 0, -0.25, 0] and sum(rewards) == traj.reward


def test_a_per_turn_baseline_trains_only_the_trajectories_whose_turns_differ_from_their_siblings(
    tiny_model_and_tokenizer,
):
    trajs = batch()
    for t in trajs[3:]:  # group b: every episode earns the same, so it carries no signal
        t.reward = 0.5
    model = fresh(tiny_model_and_tokenizer)
    cfg = TrainConfig(
        algorithm="reinforce_pp_baseline",
        reward_placement="per_turn",
        group_baseline="turn",
        group_size=3,
        lr=1e-2,
        autocast="none",
    )
    optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0)
    before = params_copy(model)
    metrics = train_step(model, optimizer, scheduler, trajs, cfg, pad_id=0)
    assert metrics["update_skipped"] == 0.0 and metrics["trained_trajectories"] == 3
    assert not same_params(model, before), "the weights did not move"
    episode = cfg.model_copy(update={"group_baseline": "episode"})
    metrics = train_step(model, optimizer, scheduler, trajs, episode, pad_id=0)
    assert metrics["trained_trajectories"] == 6  # the batch whitening shifts group b off 0


def test_negative_weight_scales_only_the_negative_advantages_and_zero_drops_the_worse_samples(
    tiny_model_and_tokenizer,
):
    assert weigh_negatives([0.5, -1.0, [0.25, -0.5, 0.0]], 0.25) == [0.5, -0.25, [0.25, -0.125, 0.0]]
    trajs = batch()  # two groups of three, each with one best sample above its group's mean
    cfg = TrainConfig(algorithm="dr_grpo", group_size=3, lr=1e-2, autocast="none")
    both = group_advantages(trajs, cfg).values
    below = sum(1 for a in both if a < 0)
    assert below > 0 and sum(1 for a in both if a > 0) > 0
    after = {}
    for weight, trained in ((1.0, 6), (0.5, 6), (0.0, 6 - below)):
        model = fresh(tiny_model_and_tokenizer)
        optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0)
        before = params_copy(model)
        weighted = cfg.model_copy(update={"negative_weight": weight})
        metrics = train_step(model, optimizer, scheduler, trajs, weighted, pad_id=0)
        assert metrics["trained_trajectories"] == trained, weight
        assert not same_params(model, before), f"negative_weight={weight}: the weights did not move"
        after[weight] = params_copy(model)
    for one, other in ((1.0, 0.5), (0.5, 0.0)):  # each weight gives its own step
        assert not all(torch.equal(a, b) for a, b in zip(after[one], after[other], strict=True))


def test_kl_in_the_reward_and_in_the_loss_need_the_reference(tiny_model_and_tokenizer):
    for kl_in in ("reward", "loss"):
        model = fresh(tiny_model_and_tokenizer, lora=True)
        cfg = TrainConfig(
            algorithm="reinforce_pp_baseline", group_size=3, kl_coef=0.1, kl_in=kl_in, autocast="none"
        )
        optimizer, scheduler = make_optimizer(model, 1e-2, 0.0, 0)
        metrics = train_step(model, optimizer, scheduler, batch(), cfg, pad_id=0)
        assert metrics["update_skipped"] == 0.0 and metrics["kl"] == pytest.approx(0.0, abs=1e-6), kl_in
    full = fresh(tiny_model_and_tokenizer)
    optimizer, scheduler = make_optimizer(full, 1e-2, 0.0, 0)
    with pytest.raises(TrainingError, match="LoRA"):
        train_step(full, optimizer, scheduler, batch(), TrainConfig(group_size=3, kl_coef=0.1), pad_id=0)


def moved_off_its_reference(tiny_model_and_tokenizer):
    """A LoRA policy whose adapter is no longer zero, so its KL to the reference is not 0."""
    model = fresh(tiny_model_and_tokenizer, lora=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    return model


def test_the_kl_terms_reference_is_one_pass_per_step_with_the_logprobs_of_a_forward_per_batch(
    tiny_model_and_tokenizer,
):
    from horizonrl.algos import kl as kl_fns
    from horizonrl.algos import losses
    from horizonrl.train.batching import collate
    from horizonrl.train.kl_penalty import KLPenalty
    from horizonrl.train.logprobs import reference_outputs, token_logprobs

    model = moved_off_its_reference(tiny_model_and_tokenizer)
    trajs = batch()
    penalty = KLPenalty(coef=0.1)
    precomputed = reference_outputs(model, trajs, pad_id=0, max_tokens=64)["ref_logprobs"]
    for traj, row in zip(trajs, precomputed, strict=True):
        per_batch = collate([traj], pad_id=0)
        given = collate([traj], pad_id=0, extras={"ref_logprobs": [row]})
        with torch.no_grad():
            logp, mask = token_logprobs(model, per_batch)[0], per_batch.loss_mask
            with model.disable_adapter():  # the reference forward of this batch alone
                ref = token_logprobs(model, per_batch)[0]
            forward = losses.reduce_loss(kl_fns.estimate(logp, ref), mask, "seq_mean_token_sum")
            reused = penalty.loss_term(logp, given, mask, "seq_mean_token_sum")
        assert float(forward) > 1e-4
        torch.testing.assert_close(reused, forward, atol=1e-5, rtol=1e-4)
    with pytest.raises(TrainingError, match="ref_logprobs"):
        penalty.loss_term(logp, per_batch, mask, "seq_mean_token_sum")

    switched_off = []
    real = model.disable_adapter
    model.disable_adapter = lambda: switched_off.append(1) or real()
    cfg = TrainConfig(
        algorithm="reinforce_pp_baseline",
        group_size=3,
        kl_coef=0.1,
        kl_in="loss",
        mini_batches=2,
        micro_batch_tokens=64,
        autocast="none",
    )
    optimizer, scheduler = make_optimizer(model, 1e-2, 0.0, 0)
    metrics = train_step(model, optimizer, scheduler, trajs, cfg, pad_id=0)
    assert metrics["kl"] > 1e-4 and metrics["optimizer_steps"] == 2
    assert len(switched_off) == 1, "the reference ran more than once in one step"


def test_the_forward_topk_kl_is_the_whole_distributions_kl_and_pulls_back_a_token_never_sampled(
    tiny_model_and_tokenizer,
):
    from horizonrl.algos import kl as kl_fns
    from horizonrl.algos import losses
    from horizonrl.train.batching import collate
    from horizonrl.train.kl_penalty import KLPenalty
    from horizonrl.train.logprobs import policy_forward, reference_outputs

    model = moved_off_its_reference(tiny_model_and_tokenizer)
    vocab = model.get_output_embeddings().weight.shape[0]
    trajs = batch()
    for top_k in (vocab, 4):
        ref = reference_outputs(model, trajs, pad_id=0, max_tokens=64, top_k=top_k)
        assert ref["ref_top_ids"][0].shape == (len(trajs[0].response_ids), top_k)
        given = collate(trajs, pad_id=0, extras={k: ref[k] for k in ("ref_top_ids", "ref_top_logprobs")})
        mask = given.loss_mask
        with torch.no_grad():
            policy = policy_forward(model, given, gather_ids=given.extras["ref_top_ids"])
            term = KLPenalty(coef=0.1, kind="forward_topk", top_k=top_k).loss_term(
                policy.logprobs, given, mask, "token_mean", policy.gathered
            )
            with model.disable_adapter():  # the whole distributions, by hand
                start = torch.log_softmax(model(given.input_ids).logits[:, :-1].float(), -1)
            now = torch.log_softmax(model(given.input_ids).logits[:, :-1].float(), -1)
            exact = losses.reduce_loss((start.exp() * (start - now)).sum(-1), mask, "token_mean")
        if top_k == vocab:  # every token: the exact forward KL
            torch.testing.assert_close(term, exact, atol=1e-5, rtol=1e-4)
        else:  # lumping the rest loses divergence, never adds it
            assert 0 < float(term) <= float(exact) + 1e-6
    # identical distributions: 0
    same = torch.log_softmax(torch.randn(3, 5), -1)
    zero = kl_fns.forward_topk(same, same)
    assert float(zero.abs().max()) < 1e-6
    with pytest.raises(ValueError, match="same as ref_top_logp"):
        kl_fns.forward_topk(same.detach(), same[:, :3])

    # A token the start liked and the policy stopped sampling: the forward KL over the start's top
    # tokens pushes it back up by its lost probability (0.4 - 0.007); the sampled-token k3 term sees
    # only the sampled token 0 and raises token 1 only through the softmax, by its tiny probability.
    ref_top = torch.log(torch.tensor([[0.5, 0.4]]))  # the start: token 0 0.5, token 1 0.4, rest 0.1
    logits = torch.tensor([[3.0, -2.0, 0.0]], requires_grad=True)  # the policy: token 1 almost gone
    kl_fns.forward_topk(ref_top, torch.log_softmax(logits, -1)[:, :2]).sum().backward()
    forward_pull = -float(logits.grad[0, 1])
    logits.grad = None
    kl_fns.estimate(torch.log_softmax(logits, -1)[:, 0], ref_top[:, 0], "k3").sum().backward()
    k3_pull = -float(logits.grad[0, 1])
    assert forward_pull == pytest.approx(0.4 - float(torch.softmax(logits.detach(), -1)[0, 1]), abs=1e-5)
    assert forward_pull > 50 * k3_pull, (forward_pull, k3_pull)

    cfg = TrainConfig(
        algorithm="reinforce_pp_baseline",
        group_size=3,
        kl_coef=0.1,
        kl_in="loss",
        kl_kind="forward_topk",
        kl_topk=4,
        mini_batches=2,
        micro_batch_tokens=64,
        autocast="none",
    )
    optimizer, scheduler = make_optimizer(model, 1e-2, 0.0, 0)
    metrics = train_step(model, optimizer, scheduler, trajs, cfg, pad_id=0)
    assert metrics["kl"] > 1e-4 and metrics["optimizer_steps"] == 2
    with pytest.raises(ValueError, match="kl_in=loss"):
        TrainConfig(algorithm="reinforce_pp_baseline", kl_coef=0.1, kl_kind="forward_topk")


def test_the_demonstration_term_adds_its_coefficient_times_the_demos_nll_gradient(tiny_model_and_tokenizer):
    """PPO-ptx: the step with train.demo_coef moves the weights by the RL step's update plus
    -lr * coef * the gradient of the demonstrations' mean NLL over their model tokens (plain SGD, no
    clipping, one optimizer step), the NLL computed here by hand from the model's logits."""
    from builders import make_traj

    from horizonrl.train.update import _demo_batches

    demos = [
        make_traj("d0", [1, 2, 3], [30, 31, 32], reward=1.0, group="demo"),
        make_traj("d1", [1, 2, 20], [33, 34, 35, 36], mask=[1, 1, 0, 1], reward=1.0, group="demo"),
    ]
    coef = 0.5

    def one_step(demo_coef: float):
        model = fresh(tiny_model_and_tokenizer)
        cfg = TrainConfig(
            algorithm="dr_grpo", group_size=3, demo_coef=demo_coef, demo_batch=2, max_grad_norm=1e9,
            autocast="none",
        )  # fmt: skip
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        before = params_copy(model)
        metrics = train_step(
            model, optimizer, scheduler, batch(), cfg, pad_id=0, demos=demos if demo_coef else ()
        )
        return [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)], metrics

    rl_only, _ = one_step(0.0)
    with_demos, metrics = one_step(coef)
    model = fresh(tiny_model_and_tokenizer)
    nll, tokens = 0.0, 0
    for d in demos:
        ids = torch.tensor([d.prompt_ids + d.response_ids])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        at = torch.arange(len(d.prompt_ids) - 1, ids.shape[1] - 1)
        picked = logp[at, ids[0, at + 1]]
        nll = nll - (picked * torch.tensor(d.loss_mask, dtype=torch.float32)).sum()
        tokens += sum(d.loss_mask)
    (nll / tokens).backward()
    mean_nll = float(nll.detach()) / tokens
    for moved, rl, p in zip(with_demos, rl_only, model.parameters(), strict=True):
        expected = -coef * p.grad if p.grad is not None else torch.zeros_like(moved)
        torch.testing.assert_close(moved - rl, expected, atol=2e-5, rtol=1e-3)
    assert metrics["demo_nll"] == pytest.approx(mean_nll, rel=1e-4)
    assert metrics["demo_loss"] == pytest.approx(coef * mean_nll, rel=1e-4)
    hand_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))
    assert metrics["demo_grad_norm"] == pytest.approx(coef * hand_norm, rel=1e-3)

    # each demonstration once before any twice, the order fixed by the seed
    cfg = TrainConfig(demo_batch=3)
    parts = _demo_batches(5, 4, cfg, seed=7)
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    assert sorted(parts[0] + parts[1][:2]) == [0, 1, 2, 3, 4]
    assert parts == _demo_batches(5, 4, cfg, seed=7) and parts != _demo_batches(5, 4, cfg, seed=8)
    # a batch with no signal (every reward equal) still takes the term's optimizer steps
    flat = batch()
    for t in flat:
        t.reward = 0.0
    cfg = TrainConfig(group_size=3, demo_coef=coef, mini_batches=2, autocast="none")
    optimizer, scheduler = make_optimizer(model, 1e-2, 0.0, 0)
    before = params_copy(model)
    metrics = train_step(model, optimizer, scheduler, flat, cfg, pad_id=0, demos=demos)
    assert metrics["trained_trajectories"] == 0 and metrics["optimizer_steps"] == 2
    assert metrics["update_skipped"] == 0 and not same_params(model, before)
    # a term without its demonstrations is refused
    optimizer, scheduler = make_optimizer(model, 1e-2, 0.0, 0)
    with pytest.raises(ValueError, match="demo_coef"):
        train_step(model, optimizer, scheduler, batch(), TrainConfig(group_size=3, demo_coef=0.5), pad_id=0)


def test_truncated_importance_weights_are_capped(tiny_model_and_tokenizer):
    model = fresh(tiny_model_and_tokenizer)
    trajs = batch()
    for t in trajs:  # a sampler far less confident than the trainer: raw weights >> cap
        t.logprobs = [-30.0 if m else 0.0 for m in t.loss_mask]
    cfg = TrainConfig(group_size=3, tis_cap=2.0, autocast="none")
    optimizer, scheduler = make_optimizer(model, 1e-2, 0.0, 0)
    metrics = train_step(model, optimizer, scheduler, trajs, cfg, pad_id=0)
    assert metrics["tis_weight_mean"] == pytest.approx(2.0) and metrics["tis_clipped_share"] == 1.0


# ---------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.algorithm=ppo2"], "'grpo', 'dr_grpo', 'dapo', 'rloo', 'reinforce_pp'"),
        (["train.advantage=gae"], "needs a critic: set train.critic=value_head"),
        (["train.algorithm=ppo", "train.critic=none"], "needs a critic"),
        (["train.critic=value_head"], "only used by train.advantage='gae'"),
        # the recipe runs reinforce_pp_turn, which sets both keys: refused with a sequence-level one
        (
            ["train.algorithm=dr_grpo", "train.reward_placement=per_turn"],
            "train.algorithm=reinforce_pp_turn sets a per-turn recipe",
        ),
        (
            ["train.algorithm=dr_grpo", "train.group_baseline=turn"],
            "or train.algorithm=reinforce_pp_turn (that baseline",
        ),
        (["train.group_baseline=state"], "'episode' or 'turn'"),
        (["train.algorithm=gspo", "train.dual_clip=3"], "dual_clip applies to policy_loss 'ppo_clip'"),
        (["train.group_size=1"], "needs train.group_size >= 2"),
        (["train.policy_loss=ppo"], "'ppo_clip', 'gspo' or 'is'"),
        (["train.reduction=sum"], "'token_mean', 'seq_mean_token_mean' or 'seq_mean_token_sum'"),
    ],
)
def test_bad_algorithm_settings_fail_at_config_load(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("configs/calc.yaml", overrides)
    assert message in str(err.value)


# ---------------------------------------------------------------- end to end on the coin env

COIN = [*TINY_COIN, "train.concurrency=8"]


def test_dynamic_sampling_trains_only_on_groups_with_signal(tmp_path):
    args = ["train", "configs/calc.yaml", *COIN, "train.algorithm=dapo", "train.steps=2"]
    result = runner.invoke(app, [*args, f"output_dir={tmp_path}", "name=dapo"])
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "dapo"
    for m in (m for m in read_metrics(run_dir / "metrics.jsonl") if "reward_mean" in m):
        trajs = read_trajectories(run_dir / "trajectories" / f"step_{m['step']:06d}.jsonl")
        groups: dict[str, set[float]] = {}
        for t in trajs:
            groups.setdefault(t.group_id, set()).add(t.reward)
        with_signal = sum(len(r) > 1 for r in groups.values())
        assert m["sampling/groups_sampled"] == len(groups)
        assert m["sampling/groups_with_signal"] == min(with_signal, 2)
        assert m["trained_trajectories"] == 4 * m["sampling/groups_with_signal"]


def test_compare_runs_algorithms_from_one_start(tmp_path):
    args = ["compare", "configs/calc.yaml", *COIN, "train.steps=1", f"output_dir={tmp_path}", "name=cmp"]
    result = runner.invoke(app, [*args, "--algorithms", "grpo,rloo"])
    assert result.exit_code == 0, result.output
    root = tmp_path / "cmp"
    rows = json.loads((root / "comparison.json").read_text())
    assert [r["algorithm"] for r in rows] == ["grpo", "rloo"]
    start = json.loads((root / "start" / "summary.json").read_text())
    for r in rows:
        assert r["start_success"] == start["start_success"] and r["steps"] == 1
        # the same tasks for every algorithm
        trajs = read_trajectories(root / r["algorithm"] / "trajectories" / "step_000001.jsonl")
        assert sorted({t.task_id for t in trajs}) == ["coin-train-0-0", "coin-train-0-1"]
    assert "| grpo |" in (root / "comparison.md").read_text()
    assert (root / "comparison.png").stat().st_size > 1000
    # a second call reuses the finished runs
    again = runner.invoke(app, [*args, "--algorithms", "grpo,rloo"])
    assert again.exit_code == 0 and "starting from" not in again.output
    bad = runner.invoke(app, [*args, "--algorithms", "grpo,ppo2"])
    assert bad.exit_code == 2 and "'ppo2'" in bad.output and "dr_grpo" in bad.output


def test_start_from_refuses_a_run_with_another_env(tmp_path):
    first = ["train", "configs/calc.yaml", *COIN, "train.steps=0", f"output_dir={tmp_path}", "name=a"]
    assert runner.invoke(app, first).exit_code == 0
    other = ["train", "configs/calc.yaml", "model.path=tiny-random", "eval.num_tasks=2", "sft.enabled=false"]
    result = runner.invoke(
        app, [*other, f"output_dir={tmp_path}", "name=b", "--start-from", str(tmp_path / "a")]
    )
    assert result.exit_code == 2 and "'env' section differs" in result.output


def test_a_wider_upper_clip_for_some_trajectories_changes_only_their_clipping(tiny_model_and_tokenizer):
    """Experience-guided samples get their own upper clip: with several optimizer steps the ratio
    leaves 1, and samples allowed a bound of 100 are clipped less often than the same batch at 0.0001."""
    cfg = TrainConfig(group_size=3, lr=5e-3, autocast="none", ppo_epochs=2, mini_batches=1, clip_high=1e-4)
    fracs = {}
    for label, bound in (("tight", None), ("wide", 100.0)):
        model = fresh(tiny_model_and_tokenizer)
        optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0)
        clip = [bound] * 6
        metrics = train_step(model, optimizer, scheduler, batch(), cfg, pad_id=0, seed=3, clip_high=clip)
        fracs[label] = metrics["clip_frac"]
    assert fracs["wide"] < fracs["tight"]
    model = fresh(tiny_model_and_tokenizer)
    optimizer, scheduler = make_optimizer(model, cfg.lr, 0.0, 0)
    with pytest.raises(ValueError, match="clip_high: expected 6 entries"):
        train_step(model, optimizer, scheduler, batch(), cfg, pad_id=0, clip_high=[0.6])
    gspo = TrainConfig(algorithm="gspo", group_size=3, autocast="none")
    with pytest.raises(ValueError, match=r"needs train\.policy_loss ppo_clip"):
        train_step(model, optimizer, scheduler, batch(), gspo, pad_id=0, clip_high=[0.6] * 6)
