"""The multi-agent commands' work: evaluating a role graph (with majority votes), MALT's tree sampling
(`horizon malt sample`) and role-wise training (`horizon malt train`).

One engine serves every role: the base model's weights once, each role's LoRA adapter beside them,
rows of different roles decoded in the same batches (:meth:`HFEngine.add_adapter`). Outputs go to the
run directory: ``graph_eval/`` (episodes, every role's trajectories, summary), ``malt/`` (trees,
per-role SFT sets and DPO pairs, report), ``malt/adapters/<role>/`` (the trained policies).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import SamplingParams, serves_adapters
from horizonrl.envs.base import Env
from horizonrl.errors import ConfigError
from horizonrl.io import write_jsonl_atomic, write_text_atomic
from horizonrl.multiagent.answers import is_correct, majority_vote
from horizonrl.multiagent.episode import EpisodeRecord, GraphRunner, episode_metrics
from horizonrl.multiagent.graph import RoleGraph, chat_chain, gvr
from horizonrl.multiagent.tree import MaltData, QuestionTree, build_datasets, check_tree_graph, sample_tree
from horizonrl.rollout.eval_k import METRICS, TaskSamples, default_ks, eval_report
from horizonrl.train.run_lock import holds_run_dir
from horizonrl.types import Task, Trajectory, read_trajectories, write_trajectories

Status = Callable[[str], None]


def configured_graph(config: Any, adapters: dict[str, Path] | None = None) -> RoleGraph:
    """The config's role graph, each role with an adapter in ``adapters`` (default
    ``multiagent.adapters``) sampling from the adapter of that name."""
    ma = config.multiagent
    if ma.graph is None:
        raise ConfigError("multiagent.graph is not set: choose a role graph, e.g. multiagent.graph=gvr")
    if ma.structured and ma.graph != "gvr":
        raise ConfigError(
            f"multiagent.structured holds gvr's verifier to a verdict object; graph {ma.graph!r} has no "
            "verifier (use multiagent.graph=gvr, or multiagent.structured=false)"
        )
    graph = (
        gvr(ma.max_new_tokens, ma.structured)
        if ma.graph == "gvr"
        else chat_chain(ma.max_turns, ma.max_new_tokens)
    )
    adapters = ma.adapters if adapters is None else adapters
    return graph.with_adapters({role: role for role in adapters})


@dataclass
class GraphSession:
    """The base model, one engine serving each role's adapter, and a chat format without tools."""

    config: Any
    graph: RoleGraph
    engine: Any
    tokenizer: Any
    identity: Any

    def runner(self, sampling: SamplingParams) -> GraphRunner:
        chat = ChatFormat(self.tokenizer, [], getattr(self.engine, "eos_token_ids", None))

        def policy(adapter: str | None) -> Any:
            return self.engine if adapter is None else self.engine.view(adapter)

        return GraphRunner(self.graph, policy, chat, sampling, self.config.env.name)

    async def close(self) -> None:
        await self.engine.close()


def open_session(
    config: Any,
    adapters: dict[str, Path] | None = None,
    status: Status | None = None,
    trains_adapters: bool = False,
) -> GraphSession:
    """Load the base model once, start the engine on it and load each role's adapter."""
    adapters = dict(config.multiagent.adapters if adapters is None else adapters)
    graph = configured_graph(config, adapters)
    engine, loaded = open_engine(config, adapters, status, trains_adapters)
    graph.check_adapters(getattr(engine, "adapters", ()))  # every role's adapter is one the engine serves
    return GraphSession(config, graph, engine, loaded.tokenizer, loaded.identity)


def open_engine(
    config: Any, adapters: dict[str, Path], status: Status | None = None, trains_adapters: bool = False
) -> tuple[Any, Any]:
    """The engine on the config's base model with each role's adapter loaded (named after the role),
    and the loaded base (its tokenizer and identity); ``trains_adapters``: the caller will load the
    roles' trained adapters into it."""
    from horizonrl.engine.factory import apply_memory_settings, engine_from_config
    from horizonrl.models import load_base

    say = status or (lambda text: None)
    for role, folder in adapters.items():
        if not Path(folder).is_dir():
            raise ConfigError(f"multiagent.adapters.{role}: {str(folder)!r} is not a directory")
    apply_memory_settings(config.engine)
    say("loading the base model")
    loaded = load_base(config.model)
    engine = engine_from_config(loaded.base, loaded.tokenizer, config.engine, config.model, config.seed)
    if (adapters or trains_adapters) and not serves_adapters(engine):
        raise ConfigError(
            f"engine.kind {config.engine.kind!r} with engine.dtype {config.engine.dtype!r} serves no "
            "per-role adapters; use engine.kind=hf with engine.dtype bfloat16 or float32"
        )
    for role, folder in adapters.items():
        say(f"loading the {role}'s adapter")
        engine.add_adapter(role, folder)
    return engine, loaded


# ---------------------------------------------------------------------------------------------------
# evaluation


async def evaluate_graph(
    runner: GraphRunner,
    tasks: Sequence[Task],
    votes: int,
    concurrency: int,
    seed: int,
    on_episode: Callable[[EpisodeRecord, list[Trajectory]], None] | None = None,
    ks: Sequence[int] | None = None,
    metrics: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run ``votes`` episodes of the graph per task; the task is solved when the majority of their final
    answers is right (MV@votes; one episode: its own answer). Returns the summary figures, with the
    sampled eval's (:mod:`horizonrl.rollout.eval_k`: pass@k, avg, best@k and maj@k at ``ks``, default
    the powers of 2 below ``votes`` and ``votes``)."""
    gate = asyncio.Semaphore(concurrency)
    records: list[list[EpisodeRecord]] = [[] for _ in tasks]

    async def one(i: int, k: int) -> None:
        async with gate:
            result = await runner.run(tasks[i], f"{tasks[i].id}/pass{k}", seed, k)
        records[i].append(result.record)
        if on_episode is not None:
            on_episode(result.record, result.trajectories)

    await asyncio.gather(*(one(i, k) for i in range(len(tasks)) for k in range(votes)))
    flat = [r for rs in records for r in rs]
    voted = [majority_vote([r.final_answer for r in rs]) for rs in records]
    solved = [is_correct(v, rs[0].expected) for v, rs in zip(voted, records, strict=True)]
    summary = episode_metrics(flat)
    summary.update(
        {
            "tasks": len(tasks),
            "majority_vote": votes,
            "success_rate": sum(solved) / len(tasks) if tasks else 0.0,
            "voted_no_answer": sum(v is None for v in voted),
        }
    )
    samples = [
        TaskSamples(
            task.id,
            Env.task_group(task),
            [is_correct(r.final_answer, r.expected) for r in rs],
            [r.reward for r in rs],
            [r.final_answer for r in rs],
        )
        for task, rs in zip(tasks, records, strict=True)
    ]
    summary.update(eval_report(samples, ks or default_ks(votes), metrics or METRICS, seed))
    return summary


def run_graph_eval(
    config: Any, tasks: Sequence[Task], out_dir: Path, status: Status | None = None, on_done: Any = None
) -> dict[str, Any]:
    """`horizon eval` of a role graph: episodes, every role's trajectories and the summary into
    ``out_dir`` (``episodes.jsonl``, ``trajectories.jsonl``, ``summary.json``)."""
    ev, ma = config.eval, config.multiagent
    temperature = ev.temperature if ev.majority_vote == 1 else ma.malt.temperature
    sampling = config.sampling.model_copy(update={"temperature": temperature, "seed": config.seed})
    session = open_session(config, status=status)
    out_dir.mkdir(parents=True, exist_ok=True)
    episodes, trajectories = [], []

    def keep(record: EpisodeRecord, trajs: list[Trajectory]) -> None:
        episodes.append(record)
        trajectories.extend(trajs)
        if on_done is not None:
            on_done(record)

    async def main() -> dict[str, Any]:
        try:
            return await evaluate_graph(
                session.runner(sampling),
                tasks,
                ev.majority_vote,
                ev.concurrency,
                config.seed,
                keep,
                ev.ks() if ev.samples_per_task == ev.majority_vote else None,
                ev.metrics,
            )
        finally:
            await session.close()

    start = time.perf_counter()
    summary = asyncio.run(main())
    summary |= {
        "graph": session.graph.name,
        "adapters": {k: str(v) for k, v in ma.adapters.items()},
        "temperature": temperature,
        "wall_s": time.perf_counter() - start,
        "generated_tokens": session.engine.stats.get("generated_tokens", 0),
    }
    write_jsonl_atomic(out_dir / "episodes.jsonl", episodes)
    write_trajectories(out_dir / "trajectories.jsonl", trajectories)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


# ---------------------------------------------------------------------------------------------------
# MALT


def malt_dir(config: Any) -> Path:
    return Path(config.run_dir) / "malt"


@holds_run_dir
def run_malt_sample(config: Any, status: Status | None = None, on_tree: Any = None) -> dict[str, Any]:
    """Build the tree of every training question with the base policies (or the configured
    adapters), then write ``malt/``: ``trees.jsonl``, ``sft_<role>.jsonl`` (trajectories of positive
    nodes), ``pairs_<role>.jsonl`` (sibling preference pairs) and ``report.json``."""
    from horizonrl.envs.factory import make_tasks

    ma = config.multiagent
    mc = ma.malt
    check_tree_graph(configured_graph(config))
    tasks = make_tasks(config.env, mc.split, mc.questions, mc.seed)
    sampling = config.sampling.model_copy(update={"temperature": mc.temperature, "seed": mc.seed})
    session = open_session(config, status=status)
    runner = session.runner(sampling)
    gate = asyncio.Semaphore(mc.concurrency)

    async def one(task: Task) -> QuestionTree:
        async with gate:
            tree = await sample_tree(runner, task, mc.n, mc.seed)
        if on_tree is not None:
            on_tree(tree)
        return tree

    async def main() -> list[QuestionTree]:
        try:
            return list(await asyncio.gather(*(one(t) for t in tasks)))
        finally:
            await session.close()

    start = time.perf_counter()
    trees = asyncio.run(main())
    wall = time.perf_counter() - start
    data = build_datasets(runner, trees, mc.threshold)
    data.report |= {
        "n": mc.n,
        "temperature": mc.temperature,
        "wall_s": wall,
        "leaves_per_minute": data.report["leaves"] / wall * 60 if wall else 0.0,
        "generated_tokens": session.engine.stats.get("generated_tokens", 0),
    }
    write_datasets(malt_dir(config), data)
    return data.report


def write_datasets(out: Path, data: MaltData) -> None:
    """``trees.jsonl``, ``sft_<role>.jsonl``, ``pairs_<role>.jsonl`` and, last (it marks the set
    complete), ``report.json``."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "trees.jsonl", "".join(json.dumps(t) + "\n" for t in data.trees))
    for role, trajs in data.sft.items():
        write_trajectories(out / f"sft_{role}.jsonl", trajs)
    for role, pairs in data.pairs.items():
        write_jsonl_atomic(out / f"pairs_{role}.jsonl", pairs)
    write_text_atomic(out / "report.json", json.dumps(data.report, indent=2) + "\n")


@holds_run_dir
def run_malt_train(config: Any, status: Status | None = None) -> dict[str, Any]:
    """Role-wise training on what `horizon malt sample` wrote: for each role a fresh LoRA adapter on the
    base, SFT on its positive nodes, then DPO on its sibling pairs for ``malt.dpo_roles`` (the
    reference is the role's SFT policy); each saved as a policy in ``malt/adapters/<role>/``."""
    from horizonrl.models import context_length, load_base
    from horizonrl.policy import write_policy_atomic
    from horizonrl.tokens import pad_token_id
    from horizonrl.train.dpo import train_dpo
    from horizonrl.train.preference_pairs import encode_pairs, read_pairs
    from horizonrl.train.sft import sft_stage
    from horizonrl.trainable import build_policy

    say = status or (lambda text: None)
    source = malt_dir(config)
    graph = configured_graph(config, {})
    check_tree_graph(graph)
    if not (source / "report.json").is_file():
        raise ConfigError(f"{source} holds no sampled trees; run `horizon malt sample CONFIG` first")
    summary: dict[str, Any] = {"roles": {}}
    autocast = config.train.autocast_dtype
    for phase in graph.phases:
        role = phase.roles[0]
        demos = read_trajectories(source / f"sft_{role}.jsonl")
        pairs_file = source / f"pairs_{role}.jsonl"
        pairs = read_pairs(pairs_file) if pairs_file.stat().st_size else []
        entry: dict[str, Any] = {"sft_examples": len(demos), "dpo_pairs": 0}
        if not demos and not (role in config.multiagent.malt.dpo_roles and pairs):
            entry["skipped"] = "no positive nodes and no pairs: the role keeps the base policy"
            summary["roles"][role] = entry
            continue
        say(f"{role}: loading the base model")
        loaded = load_base(config.model)
        pad = int(pad_token_id(loaded.tokenizer))
        start = time.perf_counter()
        if demos:
            say(f"{role}: SFT on {len(demos)} positive nodes")
            model, history = sft_stage(
                loaded.base, config.model, demos, config.sft, pad, seed=config.seed, autocast_dtype=autocast
            )
            entry["sft_final_nll"] = history[-1]["nll"]
        else:  # DPO alone: a fresh policy on the base
            model = build_policy(loaded.base, config.model).model
        if role in config.multiagent.malt.dpo_roles and pairs:
            say(f"{role}: DPO on {len(pairs)} sibling pairs")
            encoded = encode_pairs(
                pairs, loaded.tokenizer, [], context_length(model, config.model), config.env.name
            )
            history = train_dpo(model, encoded, config.dpo, pad, config.seed, autocast)
            entry["dpo_pairs"] = len(encoded)
            entry["dpo_final_loss"] = history[-1]["loss"]
            entry["dpo_final_accuracy"] = history[-1].get("accuracy")
        entry["train_s"] = time.perf_counter() - start
        out = source / "adapters" / role
        write_policy_atomic(
            out,
            model=model,
            tokenizer=loaded.tokenizer,
            base=loaded.identity,
            name=f"malt_{role}",
            description=f"MALT {role}: SFT on positive tree nodes"
            + (", then DPO on sibling pairs" if entry["dpo_pairs"] else ""),
        )
        entry["adapter"] = str(out)
        summary["roles"][role] = entry
        del model, loaded
    (source / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
