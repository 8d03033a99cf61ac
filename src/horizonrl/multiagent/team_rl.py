"""`horizon team rl`: RL of a chat chain's team on its outcome reward, one LoRA adapter per role.

Each of ``train.steps`` steps plays the chain ``train.group_size`` times on each of
``train.tasks_per_step`` training problems (``rollout.split``), every role sampling from its current
adapter (one engine serves them all, at ``sampling.temperature``), with ``train.concurrency``
episodes in workspaces at once. The roles' credit is :mod:`horizonrl.multiagent.team_credit`: the
team's outcome less the MAST failures blamed on each role (``train.failure_penalties``), compared
within each problem's episodes. Every role then takes one update of the run's policy loss
(``train_step``) on its own turns, is written to ``RUN_DIR/team/rl_adapters/<role>/`` and reloaded
into the engine before the next step. A role starts from ``multiagent.adapters.<role>`` (an SFT
adapter from `horizon team sft`) or from a fresh adapter on the base.

``team/rl_summary.json`` holds per step the outcome, each role's mean reward, the failures charged to
it and its update's metrics; ``team/rl_episodes.jsonl`` the episodes' records (the chain state
`horizon analyze` reads), appended as each step ends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from horizonrl.errors import ConfigError
from horizonrl.io import write_jsonl_atomic, write_text_atomic
from horizonrl.multiagent.chain import ChatChain, load_chain
from horizonrl.multiagent.run import open_engine
from horizonrl.multiagent.team import TeamRunner, configured_team
from horizonrl.multiagent.team_credit import Episode, team_batches
from horizonrl.multiagent.team_train import team_dir
from horizonrl.train.run_lock import holds_run_dir
from horizonrl.types import Task

Status = Callable[[str], None]
ESTIMATORS = ("grpo", "rloo")


def check_team_rl(config: Any) -> None:
    """One line for a recipe `horizon team rl` cannot run."""
    tc = config.train
    if config.multiagent.chain is None:
        raise ConfigError(
            "multiagent.chain is not set: name the chain to train, e.g. multiagent.chain=software_company"
        )
    if tc.advantage not in ESTIMATORS:
        raise ConfigError(
            f"horizon team rl compares each role within a problem's episodes: train.advantage must be "
            f"one of {', '.join(ESTIMATORS)}, got {tc.advantage!r}"
        )
    if tc.group_size < 2:
        raise ConfigError(
            f"horizon team rl needs train.group_size >= 2 episodes per problem, got {tc.group_size}"
        )
    if tc.steps < 1:
        raise ConfigError("horizon team rl needs train.steps >= 1")
    if tc.critic != "none" or tc.demo_coef > 0 or tc.failure_judge or tc.kl_coef > 0:
        raise ConfigError(
            "horizon team rl trains each role on its group-relative credit alone: set train.critic=none, "
            "train.demo_coef=0, train.kl_coef=0 and train.failure_judge=false"
        )


def _role_policy(config: Any, role: str) -> tuple[Any, Any, Any]:
    """(model, optimizer, scheduler) of ``role``: its ``multiagent.adapters`` policy made trainable,
    or fresh LoRA adapters on the base."""
    from horizonrl.models import load_base, load_policy
    from horizonrl.policy import MANIFEST, read_manifest
    from horizonrl.trainable import build_policy

    folder = config.multiagent.adapters.get(role)
    if folder is None:
        built = build_policy(load_base(config.model).base, config.model, optim=config.train)
    else:
        if (Path(folder) / MANIFEST).is_file() and len(read_manifest(Path(folder)).stages) > 1:
            raise ConfigError(
                f"multiagent.adapters.{role}: {str(folder)!r} stacks several adapters; horizon team rl "
                "continues a single-adapter policy (one from `horizon team sft`)"
            )
        model = load_policy(config.model, folder).model(trainable=True)
        built = build_policy(model, config.model, optim=config.train, has_adapter=True)
    return built.model, built.optimizer, built.scheduler


def _acting_roles(chain: ChatChain) -> list[str]:
    return sorted({role for phase, _ in chain.flat_phases() for role in phase.roles})


@holds_run_dir
def run_team_rl(config: Any, status: Status | None = None) -> dict[str, Any]:
    """The RL run of the module doc; returns the summary it writes."""
    from horizonrl.envs.factory import make_tasks
    from horizonrl.policy import write_policy_atomic
    from horizonrl.tokens import pad_token_id
    from horizonrl.train.update import train_step

    check_team_rl(config)
    say = status or (lambda text: None)
    tc = config.train
    chain = load_chain(config.multiagent.chain)
    roles = _acting_roles(chain)
    out = team_dir(config)
    adapters_dir = out / "rl_adapters"
    tasks = make_tasks(config.env, config.rollout.split, tc.steps * tc.tasks_per_step, config.seed)
    engine, loaded = open_engine(config, dict(config.multiagent.adapters), say, trains_adapters=True)
    tokenizer, identity, pad = loaded.tokenizer, loaded.identity, int(pad_token_id(loaded.tokenizer))
    del loaded
    policies: dict[str, tuple[Any, Any, Any]] = {}
    for role in roles:
        say(f"making the {role}'s policy trainable")
        policies[role] = _role_policy(config, role)
    history: list[dict[str, Any]] = []
    start = time.perf_counter()
    records: list[Any] = []
    summary: dict[str, Any] = {}

    def runner(trained: Sequence[str], seed: int) -> TeamRunner:
        playing = chain.with_adapters({r: r for r in [*config.multiagent.adapters, *trained]})
        return configured_team(
            config, playing, tokenizer, config.sampling.model_copy(update={"seed": seed}), engine
        )

    async def play(team: TeamRunner, batch: list[Task], step: int) -> list[list[Episode]]:
        gate = asyncio.Semaphore(tc.concurrency)

        async def one(task: Task, k: int) -> Episode:
            async with gate:
                return await team.run(task, f"{task.id}/step{step}.{k}", config.seed, step, k)

        done = await asyncio.gather(*(one(t, k) for t in batch for k in range(tc.group_size)))
        return [list(done[i * tc.group_size : (i + 1) * tc.group_size]) for i in range(len(batch))]

    trained: list[str] = []
    try:
        for step in range(tc.steps):
            batch = tasks[step * tc.tasks_per_step : (step + 1) * tc.tasks_per_step]
            if not batch:
                break
            say(f"step {step + 1}/{tc.steps}: {len(batch) * tc.group_size} team episodes")
            began = time.perf_counter()
            groups = asyncio.run(play(runner(trained, config.seed + step), batch, step))
            episodes = [e for g in groups for e in g]
            records.extend(record for record, _ in episodes)
            write_jsonl_atomic(out / "rl_episodes.jsonl", records)
            entry: dict[str, Any] = {
                "step": step + 1,
                "episodes": len(episodes),
                "solved": sum(r.success for r, _ in episodes),
                "outcome_mean": sum(r.reward for r, _ in episodes) / len(episodes),
                "errors": sum(r.error is not None for r, _ in episodes),
                "tokens": sum(r.generated_tokens for r, _ in episodes),
                "rollout_s": time.perf_counter() - began,
                "roles": {},
            }
            batches = team_batches(groups, tc.failure_penalties, tc.advantage, tc.norm_by_std)
            began = time.perf_counter()
            for role, rb in sorted(batches.items()):
                keep = [i for i, a in enumerate(rb.advantages) if a != 0.0]
                info: dict[str, Any] = {
                    "reward_mean": sum(rb.rewards) / len(rb.rewards),
                    "blamed": rb.blamed,
                    "trajectories": len(rb.trajectories),
                    "with_signal": len(keep),
                }
                if keep:  # a flat group teaches nothing: no update, no sync
                    say(f"step {step + 1}/{tc.steps}: updating the {role}")
                    model, optimizer, scheduler = policies[role]
                    trajs = [rb.trajectories[i] for i in keep]
                    info.update(
                        train_step(
                            model,
                            optimizer,
                            scheduler,
                            trajs,
                            tc,
                            pad,
                            config.sampling.temperature,
                            seed=config.seed + step,
                            token_advantages=[
                                [rb.advantages[i]] * len(t.response_ids)
                                for i, t in zip(keep, trajs, strict=True)
                            ],
                        )
                    )
                    folder = adapters_dir / role
                    write_policy_atomic(
                        folder,
                        model=model,
                        tokenizer=tokenizer,
                        base=identity,
                        name=f"team_rl_{role}",
                        description=f"{chain.name} {role}: RL on the team's outcome and its own failures",
                    )
                    engine.add_adapter(role, folder)
                    trained = sorted({*trained, role})
                entry["roles"][role] = info
            entry["update_s"] = time.perf_counter() - began
            history.append(entry)
            summary = {
                "chain": chain.name,
                "penalties": dict(tc.failure_penalties),
                "steps": history,
                "adapters": {  # what the team plays now: the RL adapter, else the starting one
                    **{r: str(f) for r, f in config.multiagent.adapters.items()},
                    **{r: str(adapters_dir / r) for r in trained},
                },
                "wall_s": time.perf_counter() - start,
            }
            write_text_atomic(out / "rl_summary.json", json.dumps(summary, indent=2, default=float) + "\n")
    finally:
        asyncio.run(engine.close())
    return summary
