"""Multi-agent episodes and MALT: role graphs, each role's trajectory, tree values and sibling pairs,
answer extraction and majority votes, the `horizon malt` / `horizon eval` commands' errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from horizonrl.chat import ChatFormat
from horizonrl.cli import app
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.hf import HFEngine
from horizonrl.errors import ConfigError
from horizonrl.models import tiny_random_model
from horizonrl.multiagent.answers import extract_answer, is_correct, majority_vote
from horizonrl.multiagent.episode import (
    EpisodeRecord,
    GraphRunner,
    episode_metrics,
    phase_answer,
    read_verdict,
)
from horizonrl.multiagent.graph import (
    CONSENSUS,
    Phase,
    RoleGraph,
    RoleSpec,
    VerifierVerdict,
    chat_chain,
    gvr,
)
from horizonrl.multiagent.online import node_advantages
from horizonrl.multiagent.tree import build_datasets, sample_tree
from horizonrl.multiagent.values import positive, preference_pairs, propagate_values, sibling_advantages
from horizonrl.types import Task, Trajectory

# ---------------------------------------------------------------------------------------------------
# values and pairs, against hand computations


def _tree(*leaves: list[list[float]]) -> torch.Tensor:
    return torch.tensor([leaves], dtype=torch.float32)  # [1, n, n, n]


def test_propagate_values_by_hand():
    # generation 0: verifications with 3/3, 1/3, 0/3 correct refinements; generations 1, 2 all wrong
    leaves = _tree(
        [[1, 1, 1], [1, 0, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 0, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 1, 1], [1, 1, 1]],
    )
    v_gen, v_ver, v_ref = propagate_values(leaves)
    assert v_ref.shape == (1, 3, 3, 3) and v_ver.shape == (1, 3, 3) and v_gen.shape == (1, 3)
    torch.testing.assert_close(v_ver[0, 0], torch.tensor([1.0, 1 / 3, 0.0]))
    torch.testing.assert_close(v_gen[0], torch.tensor([(1 + 1 / 3) / 3, 0.0, (2 / 3 + 1) / 3]))
    with pytest.raises(ValueError, match=r"\[Q, n, n, n\]"):
        propagate_values(torch.zeros(3, 3))


def test_a_value_of_exactly_one_half_is_negative():
    assert positive(torch.tensor([0.5, 0.5001, 0.4999, 1.0])).tolist() == [False, True, False, True]


def test_preference_pairs_by_hand():
    leaves = _tree(
        [[1, 1, 1], [1, 0, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 0, 0], [0, 0, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 1]],
    )
    sets = preference_pairs(leaves)
    # generations: values 4/9, 0, 7/9 -> only generation 2 is positive: pairs 2>0, 2>1
    gen = sets["generator"]
    assert [(p.parent, p.chosen, p.rejected) for p in gen.pairs] == [((0,), 2, 0), ((0,), 2, 1)]
    assert (gen.groups, gen.tied_groups) == (1, 0)
    # verifications of generation 0: 1, 1/3, 0 -> 0>1, 0>2; of generation 1: all 0 (tied);
    # of generation 2: 0, 2/3, 1 -> 1>0, 2>0
    ver = sets["verifier"]
    assert [(p.parent, p.chosen, p.rejected) for p in ver.pairs] == [
        ((0, 0), 0, 1),
        ((0, 0), 0, 2),
        ((0, 2), 1, 0),
        ((0, 2), 2, 0),
    ]
    assert (ver.groups, ver.tied_groups) == (3, 1)
    # refinements: a group is tied unless it mixes 1s and 0s: (0,0,1) [1,0,0] and (0,2,1) [1,1,0]
    ref = sets["refiner"]
    assert [(p.parent, p.chosen, p.rejected) for p in ref.pairs] == [
        ((0, 0, 1), 0, 1),
        ((0, 0, 1), 0, 2),
        ((0, 2, 1), 0, 2),
        ((0, 2, 1), 1, 2),
    ]
    assert (ref.groups, ref.tied_groups) == (9, 7)


def test_every_leaf_tied_gives_no_pairs_and_counts_the_groups():
    sets = preference_pairs(torch.ones(2, 3, 3, 3))
    assert all(not s.pairs for s in sets.values())
    assert [(s.groups, s.tied_groups) for s in sets.values()] == [(2, 2), (6, 6), (18, 18)]


def test_half_valued_siblings_give_no_pair():
    # verifications at exactly 0.5 (n=2: one of two refinements right) are negative like 0.0 ones
    leaves = torch.tensor([[[[1, 0], [0, 0]], [[1, 1], [1, 0]]]], dtype=torch.float32)
    sets = preference_pairs(leaves)
    assert [(p.parent, p.chosen, p.rejected) for p in sets["verifier"].pairs] == [((0, 1), 0, 1)]
    # generations: values 0.25 and 0.75
    assert [(p.chosen, p.rejected) for p in sets["generator"].pairs] == [(1, 0)]


def test_sibling_advantages_center_each_group():
    values = torch.tensor([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(sibling_advantages(values), torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]))


# ---------------------------------------------------------------------------------------------------
# answers


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("3 + 4 = 7.\nAnswer: 7", "7"),
        ("The final answer is 1,200.", "1200"),
        ("So it has 5, then 12 in the end", "12"),
        ("Answer: 2.50", "5/2"),
        ("\\boxed{42}", "42"),
        ("#### 9", "9"),
        ("Answer: 8 (from 2 * 4)", "8"),
        ("no number at all", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_marked_answers_and_carried_answers():
    assert extract_answer("step 3 gives 12", marked_only=True) is None
    # a review that marks no answer keeps the generation's; a final phase falls back to its last number
    assert phase_answer("Looks right, step 2 is fine.", "12", final=False) == "12"
    assert phase_answer("Verdict: correct. Answer: 13", "12", final=False) == "13"
    assert phase_answer("so 14 in total", "12", final=True) == "14"
    assert is_correct("1200", 1200) and not is_correct(None, 3) and not is_correct("3", "4")


def test_majority_vote():
    assert majority_vote(["3", "4", "4"]) == "4"
    assert majority_vote(["3", None, "4"]) == "3"  # a tie: the first stated
    assert majority_vote([None, None]) is None


# ---------------------------------------------------------------------------------------------------
# graphs: bad input


def _role(name: str, sees: tuple[str, ...] = ("question",), adapter: str | None = None) -> RoleSpec:
    return RoleSpec(name=name, system=f"You are the {name}.", sees=sees, adapter=adapter)


def test_a_two_role_phase_without_a_turn_cap_is_refused():
    with pytest.raises(ConfigError, match=r"cycle .*without a turn cap; set its max_turns"):
        RoleGraph(name="g", roles=(_role("a"), _role("b")), phases=(Phase(name="talk", roles=("a", "b")),))


def test_seeing_a_later_phase_is_refused():
    with pytest.raises(ConfigError, match="sees 'second', which is not an earlier phase"):
        RoleGraph(
            name="g",
            roles=(_role("a", ("question", "second")), _role("b")),
            phases=(Phase(name="first", roles=("a",)), Phase(name="second", roles=("b",))),
        )
    with pytest.raises(ConfigError, match="names unknown role 'c'"):
        RoleGraph(name="g", roles=(_role("a"),), phases=(Phase(name="p", roles=("c",)),))


def test_unknown_adapters_are_refused():
    graph = gvr().with_adapters({"verifier": "verifier"})
    with pytest.raises(
        ConfigError, match="role 'verifier' names unknown adapter 'verifier'; adapters: generator"
    ):
        graph.check_adapters(["generator"])
    with pytest.raises(ConfigError, match=r"unknown role.* judge"):
        gvr().with_adapters({"judge": "x"})


# ---------------------------------------------------------------------------------------------------
# episodes on a real (tiny) model and engine


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model()


def _task(i: int = 0, answer: int = 7) -> Task:
    return Task(
        id=f"q{i}",
        env="calc",
        data={"question": f"Tom has 3 apples and gets 4 more ({i}).", "answer": answer},
    )


def _own_tokens(traj: Trajectory) -> list[list[int]]:
    """The runs of tokens masked 1 (the role's own turns)."""
    runs, current = [], []
    for token, m in zip(traj.response_ids, traj.loss_mask, strict=True):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


async def test_each_role_trajectory_masks_only_its_own_tokens(tiny):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer)
    chat = ChatFormat(tokenizer, [], engine.eos_token_ids)
    runner = GraphRunner(
        gvr(12), lambda adapter: engine, chat, SamplingParams(temperature=1.0, seed=3), "calc"
    )
    try:
        result = await runner.run(_task(), "ep-1")
    finally:
        await engine.close()
    trajs = {t.role: t for t in result.trajectories}
    assert list(trajs) == ["generator", "verifier", "refiner"]
    assert result.record.order == ["generator", "verifier", "refiner"]
    for role, traj in trajs.items():
        assert traj.episode_id == "ep-1" and traj.id == f"ep-1/{role}"
        # one turn: the model's tokens exactly, then the template's end-of-turn tokens (masked 0)
        (own,) = _own_tokens(traj)
        assert len(own) == sum(traj.loss_mask) <= 12
        assert traj.loss_mask[: len(own)] == [1] * len(own)
        assert all(lp < 0 or m == 0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True))
        assert traj.messages[-1].role == "assistant" and traj.messages[0].content.startswith("You")
    # the verifier's prompt shows the generator's solution, the refiner's both earlier phases'
    generation = trajs["generator"].messages[-1].content
    assert generation in trajs["verifier"].messages[1].content
    review = trajs["verifier"].messages[-1].content
    assert (
        generation in trajs["refiner"].messages[1].content and review in trajs["refiner"].messages[1].content
    )
    # the records survive a JSON round trip with their episode links; single-agent records have none
    again = Trajectory.model_validate_json(trajs["refiner"].to_json())
    assert (again.episode_id, again.role) == ("ep-1", "refiner")
    plain = json.loads(again.model_copy(update={"episode_id": None, "role": None}).to_json())
    assert "episode_id" not in plain and "role" not in plain


VERDICT_ONLY = {
    "type": "object",
    "properties": {"verdict": {"enum": ["correct", "incorrect"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}


async def test_a_role_with_an_output_schema_samples_its_turns_under_it(tiny):
    """The checker's reply is held to its schema by the engine (a random model writes a valid
    object), its trajectory marks the turn constrained with the schema, and the phase records the
    verdict; the free role's turn stays unconstrained."""
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer)
    chat = ChatFormat(tokenizer, [], engine.eos_token_ids)
    graph = RoleGraph(
        name="check",
        roles=(
            RoleSpec(name="solver", system="Solve.", max_new_tokens=8),
            RoleSpec(
                name="checker",
                system="Check.",
                sees=("question", "solve"),
                max_new_tokens=32,
                output_schema=VERDICT_ONLY,
            ),
        ),
        phases=(Phase(name="solve", roles=("solver",)), Phase(name="check", roles=("checker",))),
    )
    runner = GraphRunner(graph, lambda adapter: engine, chat, SamplingParams(temperature=1.0, seed=5), "calc")
    try:
        result = await runner.run(_task(), "ep-s")
    finally:
        await engine.close()
    trajs = {t.role: t for t in result.trajectories}
    checker, solver = trajs["checker"], trajs["solver"]
    reply = json.loads(checker.messages[-1].content)
    assert reply["verdict"] in ("correct", "incorrect") and set(reply) == {"verdict"}
    assert result.record.phases[1].verdict == reply["verdict"]
    (own,) = _own_tokens(checker)
    (span,) = checker.constrained
    assert (span.start, span.end) == (0, len(own))
    assert checker.constraints[span.constraint]["json_schema"] == VERDICT_ONLY
    assert solver.constrained is None and solver.constraints is None
    assert Trajectory.model_validate_json(checker.to_json()).constrained == checker.constrained


async def test_online_malt_updates_a_structured_verifier_under_its_replayed_masks(tiny):
    """Online MALT's update of a verifier held to its verdict object: its tree nodes' turns are
    constrained, and the trainer, replaying the masks, computes the sampler's logprobs (KL ~ 0)."""
    import copy

    from horizonrl.config import TrainConfig
    from horizonrl.engine.replay import ConstraintReplay
    from horizonrl.optim import make_optimizer
    from horizonrl.train.update import train_step

    model, tokenizer = tiny
    engine = HFEngine(copy.deepcopy(model).eval(), tokenizer, seed=0)
    chat = ChatFormat(tokenizer, [], engine.eos_token_ids)
    sampling = SamplingParams(temperature=1.0, seed=2)
    runner = GraphRunner(gvr(12, structured=True), lambda adapter: engine, chat, sampling, "calc")
    try:
        trees = [await sample_tree(runner, _task(i), n=2, seed=0) for i in range(2)]
    finally:
        await engine.close()
    trajs, _ = node_advantages(runner, trees)["verifier"]
    assert all(t.constrained and t.constraints[0]["json_schema"] for t in trajs)
    assert all(t.messages[-1].content.startswith('{"critique": "') for t in trajs)
    policy = copy.deepcopy(model).requires_grad_(True)
    optimizer, scheduler = make_optimizer(policy, 1e-3, 0.0, 0)
    cfg = TrainConfig(autocast="none", group_size=2)
    token_advs = [[1.0 if i % 2 else -1.0] * len(t.response_ids) for i, t in enumerate(trajs)]
    metrics = train_step(
        policy,
        optimizer,
        scheduler,
        trajs,
        cfg,
        pad_id=0,
        token_advantages=token_advs,
        replay=ConstraintReplay(tokenizer, policy),
    )
    assert metrics["trained_trajectories"] == len(trajs) and abs(metrics["sampler_kl"]) < 1e-5


def test_structured_gvr_holds_the_verifier_to_a_strict_verdict_object():
    verifier = gvr(structured=True).role("verifier")
    schema = verifier.output_schema
    assert schema is not None and schema["additionalProperties"] is False
    assert schema["required"] == ["critique", "verdict"] and "JSON" in verifier.system
    assert gvr().role("verifier").output_schema is None
    assert VerifierVerdict.model_validate({"critique": "ok", "verdict": "correct"}).verdict == "correct"


def test_a_structured_graph_other_than_gvr_is_refused():
    from horizonrl.config import load_config
    from horizonrl.multiagent.run import configured_graph

    config = load_config("configs/malt.yaml", ["multiagent.graph=chat_chain", "multiagent.structured=true"])
    with pytest.raises(ConfigError, match="has no verifier"):
        configured_graph(config)


def test_read_verdict_from_an_object_or_a_last_line():
    assert read_verdict('{"critique": "step 2 is off", "verdict": "incorrect"}') == "incorrect"
    assert read_verdict("Step 1 ok.\nVerdict: incorrect\nOn reflection, Verdict: **Correct**") == "correct"
    assert read_verdict('{"verdict": "maybe"}') is None and read_verdict("looks fine") is None


def test_verdict_accuracy_scores_the_verdict_against_the_answer_it_judged():
    def record(generated: str, verdict: str | None) -> EpisodeRecord:
        phases = [
            {"name": "generate", "roles": ["generator"], "turns": 1, "solution": "", "answer": generated},
            {
                "name": "verify",
                "roles": ["verifier"],
                "turns": 1,
                "solution": "",
                "answer": generated,
                "verdict": verdict,
            },
        ]
        return EpisodeRecord(
            episode_id="e",
            graph="gvr",
            task_id="t",
            order=["generator", "verifier"],
            adapters={},
            phases=phases,
            final_answer=generated,
            expected="7",
            reward=float(generated == "7"),
        )

    # right answer called correct (agrees), wrong called correct (disagrees), wrong called incorrect
    # (agrees), one with no verdict (not counted)
    metrics = episode_metrics(
        [record("7", "correct"), record("8", "correct"), record("9", "incorrect"), record("7", None)]
    )
    assert metrics["verdicts_verify"] == 3
    assert metrics["verdict_accuracy_verify"] == pytest.approx(2 / 3)
    assert "verdicts_generate" not in metrics


class ScriptedEngine:
    """Stands in for a policy whose texts a test must choose (the tree's leaves need known answers):
    the next text of the role named in the prompt's system message, tokenized by the real tokenizer."""

    def __init__(self, tokenizer, texts: dict[str, list[str]]) -> None:
        self.tokenizer, self.texts, self.count = tokenizer, texts, dict.fromkeys(texts, 0)

    async def generate(self, prompt_ids, params):
        prompt = self.tokenizer.decode(prompt_ids)
        role = next(r for r in self.texts if f"[{r}]" in prompt)
        options = self.texts[role]
        text = options[self.count[role] % len(options)]
        self.count[role] += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Completion(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


def _tagged_gvr() -> RoleGraph:
    graph = gvr()
    roles = tuple(r.model_copy(update={"system": f"[{r.name}] {r.system}"}) for r in graph.roles)
    return graph.model_copy(update={"roles": roles})


async def test_two_role_phases_alternate_until_consensus_or_the_cap(tiny):
    _, tokenizer = tiny
    graph = chat_chain(max_turns=3)
    roles = tuple(r.model_copy(update={"system": f"[{r.name}] {r.system}"}) for r in graph.roles)
    graph = graph.model_copy(update={"roles": roles})
    engine = ScriptedEngine(
        tokenizer,
        {
            "planner": ["First add 3 and 4."],
            "solver": ["3 + 4 = 7. Answer: 7"],
            "reviewer": [f"Correct. {CONSENSUS}"],
            "checker": ["Answer: 7"],
        },
    )
    chat = ChatFormat(tokenizer, [])
    runner = GraphRunner(graph, lambda a: engine, chat, SamplingParams(temperature=0.0), "calc")
    result = await runner.run(_task(), "ep-2")
    plan, check = result.record.phases
    # planning never reaches consensus: capped at 3 turns (planner, solver, planner); the phase's
    # solution is the solver's last message
    assert plan.turns == 3 and not plan.consensus and plan.solution == "3 + 4 = 7. Answer: 7"
    assert check.turns == 1 and check.consensus  # the reviewer's first turn ends it
    assert result.record.order == ["planner", "solver", "planner", "reviewer"]
    trajs = {t.role: t for t in result.trajectories}
    planner = trajs["planner"]
    assert planner.num_turns == 2 and len(_own_tokens(planner)) == 2
    # the solver's message is in the planner's tokens, masked 0
    solver_ids = tokenizer.encode("3 + 4 = 7. Answer: 7", add_special_tokens=False)
    seq = planner.response_ids
    start = next(i for i in range(len(seq)) if seq[i : i + len(solver_ids)] == solver_ids)
    assert planner.loss_mask[start : start + len(solver_ids)] == [0] * len(solver_ids)
    # the reviewer sees the plan phase's solution, nothing of the planner's own turns
    assert "3 + 4 = 7" in trajs["reviewer"].messages[1].content
    assert "First add" not in trajs["reviewer"].messages[1].content
    assert result.record.final_answer == "7" and result.record.reward == 1.0


def _scripted_tree_runner(tokenizer) -> GraphRunner:
    """A gvr runner whose roles write known texts: generations right (7) or wrong (12), reviews, and
    refinements that answer 7 or state no number."""
    engine = ScriptedEngine(
        tokenizer,
        {
            "generator": ["3 + 4 = 7. Answer: 7", "3 * 4 = 12. Answer: 12"],
            "verifier": ["Verdict: correct", "Verdict: incorrect. Answer: 1"],
            "refiner": ["Answer: 7", "I cannot tell."],
        },
    )
    return GraphRunner(_tagged_gvr(), lambda a: engine, ChatFormat(tokenizer, []), SamplingParams(), "calc")


async def test_tree_values_pairs_and_sft_sets_from_known_leaves(tiny):
    _, tokenizer = tiny
    runner = _scripted_tree_runner(tokenizer)
    tree = await sample_tree(runner, _task(), n=2, seed=0)
    assert tree.leaf_rewards.shape == (2, 2, 2)
    data = build_datasets(runner, [tree])
    report = data.report
    assert report["leaves"] == 8 and report["questions"] == 1
    # "I cannot tell." states no number: its leaf is wrong (reward 0) and counted
    assert report["no_answer_leaves"] == 4 and float(tree.leaf_rewards.sum()) == 4.0
    # every refinement group mixes "Answer: 7" (1) and no answer (0): one pair each, 4 groups
    assert report["refiner_pairs"] == 4 and report["refiner_tied_groups"] == 0
    assert all(p.chosen[0].content == "Answer: 7" for p in data.pairs["refiner"])
    # verifications: each has value 1/2 (one of two refinements right): negative, all tied
    assert report["verifier_positives"] == 0 and report["verifier_tied_groups"] == 2
    # SFT sets hold the positive nodes' own trajectories, grouped by siblings
    assert len(data.sft["refiner"]) == 4
    assert all(t.role == "refiner" and t.group_id.startswith("q0/tree/") for t in data.sft["refiner"])
    # the online variant's credit: value minus the siblings' mean, per role; groups are siblings
    credit = node_advantages(runner, [tree])
    trajs, advs = credit["refiner"]
    assert len(trajs) == 8 and len({t.group_id for t in trajs}) == 4
    for traj, adv in zip(trajs, advs, strict=True):
        assert adv == (0.5 if traj.messages[-1].content == "Answer: 7" else -0.5)
    assert credit["verifier"][1] == [0.0] * 4  # every verification is worth 1/2: no signal


def test_malt_train_without_samples_and_bad_adapters_are_one_line_errors(tmp_path):
    runner = CliRunner()
    args = ["configs/malt.yaml", f"output_dir={tmp_path}", "model.path=tiny-random"]
    result = runner.invoke(app, ["malt", "train", *args])
    assert result.exit_code == 2
    assert "holds no sampled trees; run `horizon malt sample CONFIG` first" in result.output
    result = runner.invoke(app, ["eval", *args, f"multiagent.adapters.generator={tmp_path}/none"])
    assert result.exit_code == 2
    assert "multiagent.adapters.generator" in result.output and "is not a directory" in result.output
    result = runner.invoke(app, ["eval", *args, "multiagent.graph=gvr2"])
    assert result.exit_code == 2 and "multiagent.graph" in result.output
    result = runner.invoke(app, ["malt", "online", *args, "train.demo_coef=1"])
    assert result.exit_code == 2 and "train.demo_coef=0" in result.output
    assert not any(tmp_path.iterdir())  # nothing written


async def _scripted_data(tokenizer):
    runner = _scripted_tree_runner(tokenizer)
    trees = [await sample_tree(runner, _task(i), n=2, seed=0) for i in range(2)]
    return build_datasets(runner, trees)


def test_role_wise_training_then_a_graph_eval_with_the_trained_adapter(tiny, tmp_path):
    """`horizon malt train`'s work on known trees (the tiny model, real SFT and DPO), then the trained
    refiner served by the engine beside the base roles in `horizon eval`'s graph evaluation."""
    from horizonrl.config import load_config
    from horizonrl.multiagent.run import malt_dir, run_graph_eval, run_malt_train, write_datasets

    _, tokenizer = tiny
    overrides = [f"output_dir={tmp_path}", "model.path=tiny-random", "multiagent.max_new_tokens=8"]
    config = load_config("configs/malt.yaml", overrides)
    write_datasets(malt_dir(config), asyncio.run(_scripted_data(tokenizer)))
    summary = run_malt_train(config)
    roles = summary["roles"]
    # only the refiner's nodes split (value 1 / 0); generations and verifications are worth 1/2
    assert "no positive nodes and no pairs" in roles["generator"]["skipped"]
    assert "no positive nodes and no pairs" in roles["verifier"]["skipped"]
    refiner = roles["refiner"]
    assert refiner["sft_examples"] == 8 and refiner["dpo_pairs"] == 8
    assert (Path(refiner["adapter"]) / "adapter_config.json").is_file()

    config = load_config(
        "configs/malt.yaml",
        [*overrides, "eval.num_tasks=2", f"multiagent.adapters.refiner={refiner['adapter']}"],
    )
    tasks = [_task(0), _task(1)]
    result = run_graph_eval(config, tasks, tmp_path / "graph_eval")
    assert result["tasks"] == 2 and result["episodes"] == 2
    records = [
        json.loads(line) for line in (tmp_path / "graph_eval" / "episodes.jsonl").read_text().splitlines()
    ]
    assert all(r["adapters"] == {"generator": None, "verifier": None, "refiner": "refiner"} for r in records)
    trajs = [
        Trajectory.model_validate_json(line)
        for line in (tmp_path / "graph_eval" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert sorted(t.role for t in trajs) == ["generator"] * 2 + ["refiner"] * 2 + ["verifier"] * 2
