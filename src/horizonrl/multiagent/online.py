"""MALT online: GRPO per role where the tree gives the credit, with no learned critic.

Each round samples the trees of a batch of training questions with the roles' current adapters
(one engine serves all three), then updates every role's adapter on its own nodes: a node's
advantage is its tree value minus the mean of its siblings' (:func:`sibling_advantages`), the same
for every token the role wrote there; siblings share a GRPO group. The loss is the run's
``train`` policy loss (PPO-clip by default) with these advantages in place of the estimator's; the
logprobs compare at the tree's sampling temperature. After the update each role's adapter is written
and loaded into the engine for the next round. The budget matches the offline recipe's when
``malt.questions`` trees are spread over the rounds.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import torch

from horizonrl.errors import ConfigError
from horizonrl.multiagent.run import Status, malt_dir, open_session
from horizonrl.multiagent.tree import QuestionTree, check_tree_graph, sample_tree, tree_nodes
from horizonrl.multiagent.values import propagate_values, sibling_advantages
from horizonrl.train.run_lock import holds_run_dir
from horizonrl.types import Trajectory


def node_advantages(
    runner: Any, trees: list[QuestionTree]
) -> dict[str, tuple[list[Trajectory], list[float]]]:
    """Per role: its nodes' trajectories (siblings grouped) and each one's advantage."""
    values = propagate_values(torch.stack([t.leaf_rewards for t in trees]))
    out: dict[str, tuple[list[Trajectory], list[float]]] = {}
    for level, phase in enumerate(runner.graph.phases):
        advantages = sibling_advantages(values[level])
        trajs, advs = [], []
        for q, tree in enumerate(trees):
            for node in tree_nodes(tree, level):
                value = float(values[level][(q, *node.path)])
                trajs.append(tree.trajectory(runner, node, value))
                advs.append(float(advantages[(q, *node.path)]))
        out[phase.roles[0]] = (trajs, advs)
    return out


@holds_run_dir
def run_malt_online(config: Any, rounds: int, status: Status | None = None) -> dict[str, Any]:
    """``rounds`` rounds of tree sampling and per-role updates over ``malt.questions`` questions in
    all; the adapters go to ``malt/online_adapters/<role>/`` and the per-round figures to
    ``malt/online_summary.json``."""
    from horizonrl.engine.replay import ConstraintReplay
    from horizonrl.envs.factory import make_tasks
    from horizonrl.models import load_base
    from horizonrl.policy import write_policy_atomic
    from horizonrl.tokens import pad_token_id
    from horizonrl.train.update import train_step
    from horizonrl.trainable import build_policy

    say = status or (lambda text: None)
    mc, tc = config.multiagent.malt, config.train
    if rounds < 1 or rounds > mc.questions:
        raise ConfigError(f"rounds must be between 1 and malt.questions ({mc.questions}), got {rounds}")
    if tc.demo_coef > 0:
        raise ConfigError(
            "train.demo_coef trains on the SFT stage's demonstrations in `horizon train`; online MALT "
            "has none: set train.demo_coef=0"
        )
    out_root = malt_dir(config)
    adapters_dir = out_root / "online_adapters"
    tasks = make_tasks(config.env, mc.split, mc.questions, mc.seed)
    per_round = -(-len(tasks) // rounds)
    session = open_session(config, adapters={}, status=say, trains_adapters=True)
    check_tree_graph(session.graph)
    roles = [p.roles[0] for p in session.graph.phases]
    models: dict[str, Any] = {}
    optimizers: dict[str, tuple[Any, Any]] = {}
    for role in roles:
        loaded = load_base(config.model)
        built = build_policy(loaded.base, config.model, optim=tc)
        models[role], optimizers[role] = built.model, (built.optimizer, built.scheduler)
    tokenizer, identity = loaded.tokenizer, loaded.identity
    pad = int(pad_token_id(tokenizer))
    # a role held to an output schema (multiagent.structured): its turns' masks rebuilt for the update
    structured = any(r.output_schema is not None for r in session.graph.roles)
    replay = ConstraintReplay(tokenizer, loaded.base) if structured else None
    sampling = config.sampling.model_copy(update={"temperature": mc.temperature})
    history: list[dict[str, Any]] = []
    start = time.perf_counter()

    async def sample(batch: list[Any], runner: Any, round_seed: int) -> list[QuestionTree]:
        gate = asyncio.Semaphore(mc.concurrency)

        async def one(task: Any) -> QuestionTree:
            async with gate:
                return await sample_tree(runner, task, mc.n, round_seed)

        return list(await asyncio.gather(*(one(t) for t in batch)))

    try:
        for r in range(rounds):
            batch = tasks[r * per_round : (r + 1) * per_round]
            if not batch:
                break
            graph = session.graph.with_adapters({role: role for role in roles if r > 0})
            session.graph = graph
            runner = session.runner(sampling.model_copy(update={"seed": mc.seed + r}))
            say(f"round {r + 1}/{rounds}: sampling {len(batch)} trees")
            trees = asyncio.run(sample(batch, runner, mc.seed + r))
            entry: dict[str, Any] = {
                "round": r + 1,
                "questions": len(trees),
                "leaf_accuracy": float(torch.stack([t.leaf_rewards for t in trees]).mean()),
            }
            for role, (trajs, advs) in node_advantages(runner, trees).items():
                say(f"round {r + 1}/{rounds}: updating the {role}")
                token_advs = [[a] * len(t.response_ids) for t, a in zip(trajs, advs, strict=True)]
                opt, sched = optimizers[role]
                stats = train_step(
                    models[role],
                    opt,
                    sched,
                    trajs,
                    tc,
                    pad,
                    mc.temperature,
                    token_advantages=token_advs,
                    replay=replay,
                )
                entry[role] = {"nodes": len(trajs), "signal": sum(a != 0 for a in advs), **stats}
                folder = adapters_dir / role
                write_policy_atomic(
                    folder,
                    model=models[role],
                    tokenizer=tokenizer,
                    base=identity,
                    name=f"malt_online_{role}",
                    description=f"MALT online {role}: GRPO on tree advantages",
                )
                session.engine.add_adapter(role, folder)
            history.append(entry)
            _write_summary(out_root, history, time.perf_counter() - start)
    finally:
        asyncio.run(session.close())
    return {"rounds": history, "adapters": {role: str(adapters_dir / role) for role in roles}}


def _write_summary(out_root: Path, history: list[dict[str, Any]], wall_s: float) -> None:
    out_root.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"rounds": history, "wall_s": wall_s}, indent=2, default=float)
    (out_root / "online_summary.json").write_text(text + "\n", encoding="utf-8")
