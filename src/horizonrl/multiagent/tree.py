"""MALT's tree sampling: per question, ``n`` generations, ``n`` verifications of each, ``n`` refinements of
each verification; leaf rewards from the task's answer; values, labels and sibling preference pairs
(:mod:`horizonrl.multiagent.values`); per-role SFT sets and DPO pairs.

The tree works on any graph of three single-role phases (``gvr`` is the shipped one). Every node is
one role's turn, kept as that role's trajectory (exact tokens, its own tokens masked 1), so a role's
SFT set is a list of trajectories and its DPO pairs are prompt/chosen/rejected message lists that
``horizon dpo`` reads too.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from horizonrl.errors import ConfigError
from horizonrl.multiagent.answers import is_correct
from horizonrl.multiagent.episode import GraphRunner, RoleView, phase_answer, task_question
from horizonrl.multiagent.graph import RoleGraph
from horizonrl.multiagent.values import ROLES, preference_pairs, propagate_values
from horizonrl.train.preference_pairs import PreferencePair
from horizonrl.types import Message, Task, Trajectory


@dataclass
class Node:
    """One role's turn in the tree: its path (branch index per level), view, text and answer."""

    path: tuple[int, ...]
    view: RoleView
    text: str
    answer: str | None
    children: list[Node] = field(default_factory=list)


@dataclass
class QuestionTree:
    task: Task
    roots: list[Node]
    leaf_rewards: torch.Tensor  # [n, n, n]
    sample_s: float

    def node(self, path: tuple[int, ...]) -> Node:
        node = self.roots[path[0]]
        for i in path[1:]:
            node = node.children[i]
        return node

    def trajectory(self, runner: GraphRunner, node: Node, value: float) -> Trajectory:
        """The node's turn as its role's trajectory (reward: the node's value); siblings (the same
        parent) share a group, the online variant's GRPO group."""
        episode_id = f"{self.task.id}/tree/{_dotted(node.path)}"
        traj = runner.trajectory(node.view, self.task, episode_id, value, value > 0.5)
        return traj.model_copy(update={"group_id": f"{self.task.id}/tree/{_dotted(node.path[:-1])}"})


def _dotted(path: Any) -> str:
    return ".".join(map(str, path))


def tree_nodes(tree: QuestionTree, level: int) -> list[Node]:
    """The nodes at depth ``level`` (0: generations), in index order."""
    nodes = list(tree.roots)
    for _ in range(level):
        nodes = [child for node in nodes for child in node.children]
    return nodes


def check_tree_graph(graph: RoleGraph) -> None:
    if len(graph.phases) != 3 or any(len(p.roles) != 1 for p in graph.phases):
        shape = " -> ".join("+".join(p.roles) for p in graph.phases)
        raise ConfigError(
            f"MALT's tree needs a graph of three single-role phases (generator -> verifier -> refiner); "
            f"graph {graph.name!r} is {shape}"
        )


async def sample_tree(runner: GraphRunner, task: Task, n: int, seed: int) -> QuestionTree:
    """The tree of ``task`` (see the module doc); siblings are sampled concurrently, so the engine
    batches a whole level across the questions in flight."""
    graph = runner.graph
    check_tree_graph(graph)
    question = task_question(task)
    start = time.perf_counter()
    phases = graph.phases

    async def expand(
        level: int, path: tuple[int, ...], solutions: dict[str, str], previous: str | None
    ) -> Node:
        phase = phases[level]
        views, _, _ = await runner.run_phase(phase, question, solutions, seed, task.id, *path)
        view = views[0]
        text = view.last_said
        answer = phase_answer(text, previous, level == len(phases) - 1)
        node = Node(path, view, text, answer)
        if level + 1 < len(phases):
            below = {**solutions, phase.name: text}
            node.children = list(
                await asyncio.gather(*(expand(level + 1, (*path, i), below, answer) for i in range(n)))
            )
        return node

    roots = list(await asyncio.gather(*(expand(0, (i,), {}, None) for i in range(n))))
    expected = task.data.get("answer")
    rewards = torch.tensor(
        [[[float(is_correct(r.answer, expected)) for r in v.children] for v in g.children] for g in roots]
    )
    return QuestionTree(task, roots, rewards, time.perf_counter() - start)


@dataclass
class MaltData:
    """What ``horizon malt sample`` writes: per-role SFT trajectories and DPO pairs, the trees' records
    and the counts behind them."""

    sft: dict[str, list[Trajectory]]
    pairs: dict[str, list[PreferencePair]]
    trees: list[dict[str, Any]]
    report: dict[str, Any]


def build_datasets(runner: GraphRunner, trees: list[QuestionTree], threshold: float = 0.5) -> MaltData:
    """Values, labels, per-role SFT sets (positive nodes) and sibling pairs from sampled trees."""
    roles = [p.roles[0] for p in runner.graph.phases]
    sft: dict[str, list[Trajectory]] = {r: [] for r in roles}
    pairs: dict[str, list[PreferencePair]] = {r: [] for r in roles}
    counts: Counter[str] = Counter()
    records: list[dict[str, Any]] = []
    if not trees:
        raise ConfigError("no trees were sampled: nothing to build MALT's datasets from")
    rewards = torch.stack([t.leaf_rewards for t in trees])
    values = propagate_values(rewards)
    pair_sets = preference_pairs(rewards, threshold)
    for level, (role, generic) in enumerate(zip(roles, ROLES, strict=True)):
        level_values = values[level]
        for index in torch.nonzero(level_values > threshold).tolist():
            q, *path = index
            node = trees[q].node(tuple(path))
            sft[role].append(trees[q].trajectory(runner, node, float(level_values[tuple(index)])))
        pair_set = pair_sets[generic]
        counts[f"{role}_sibling_groups"] = pair_set.groups
        counts[f"{role}_tied_groups"] = pair_set.tied_groups
        for pair in pair_set.pairs:
            q, *parent = pair.parent
            chosen = trees[q].node((*parent, pair.chosen))
            rejected = trees[q].node((*parent, pair.rejected))
            if chosen.text == rejected.text:  # the same text scored apart: nothing to prefer
                counts[f"{role}_identical_pairs"] += 1
                continue
            pairs[role].append(
                PreferencePair(
                    id=f"{trees[q].task.id}/{role}/{_dotted(parent)}:{pair.chosen}>{pair.rejected}",
                    prompt=chosen.view.messages[:2],
                    chosen=[Message(role="assistant", content=chosen.text)],
                    rejected=[Message(role="assistant", content=rejected.text)],
                    tools=[],
                )
            )
    for q, tree in enumerate(trees):
        records.append(
            {
                "task_id": tree.task.id,
                "expected": str(tree.task.data.get("answer")),
                "leaf_rewards": tree.leaf_rewards.tolist(),
                "v_gen": values[0][q].tolist(),
                "v_ver": values[1][q].tolist(),
                "generations": [
                    {
                        "text": g.text,
                        "answer": g.answer,
                        "verifications": [
                            {
                                "text": v.text,
                                "answer": v.answer,
                                "refinements": [r.answer for r in v.children],
                            }
                            for v in g.children
                        ],
                    }
                    for g in tree.roots
                ],
            }
        )
    n_leaves = int(rewards.numel())
    report: dict[str, Any] = {
        "questions": len(trees),
        "leaves": n_leaves,
        "leaf_accuracy": float(rewards.mean()),
        "questions_all_leaves_tied": int(
            sum(bool((t.leaf_rewards == t.leaf_rewards.flatten()[0]).all()) for t in trees)
        ),
        **{f"{r}_positives": len(sft[r]) for r in roles},
        **{f"{r}_pairs": len(pairs[r]) for r in roles},
        **dict(counts),
        "no_answer_leaves": sum(
            r.answer is None for t in trees for g in t.roots for v in g.children for r in v.children
        ),
    }
    return MaltData(sft, pairs, records, report)
