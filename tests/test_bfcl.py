"""The ``bfcl`` env: BFCL's multi-turn worlds, its tool docs as tool specs, its ground-truth call
strings as structured calls, episodes through the agent loop, and agreement with bfcl-eval's own
multi-turn checker on the ground truth and on perturbations of it."""

from __future__ import annotations

import ast
import itertools
import json
import random
import sys

import pytest

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.api.bfcl import END_OF_TURN, BfclEnv
from horizonrl.envs.api.bfcl_world import (
    BfclEpisode,
    CallParseError,
    class_docs,
    convert_schema,
    parse_call,
    task_signatures,
    to_tool_spec,
)
from horizonrl.envs.registry import get_env_class
from horizonrl.errors import ConfigError
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Action, Message, ToolCall

OPTIONS = BfclEnv.Options()
INSTALL = "pip install --no-deps bfcl-eval==2026.3.23 (or make setup)"


@pytest.fixture(scope="module")
def tasks():
    return BfclEnv.make_tasks("test", 200, 0, OPTIONS)


def agent_for(tokenizer, engine=None, **cfg) -> Agent:
    config = AgentConfig(**({"max_turns": 30, "max_total_tokens": 8192} | cfg))
    return Agent(tokenizer, engine, SamplingParams(max_new_tokens=256), config, context_length=8192)


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(id=f"c_{name}", name=name, arguments=arguments)


# ---------------------------------------------------------------------------------------------------
def test_tool_docs_become_json_schema_tool_specs():
    doc = {
        "name": "f",
        "description": "Does f.",
        "parameters": {
            "type": "dict",
            "properties": {
                "x": {"type": "float", "description": "a number"},
                "pair": {"type": "tuple", "items": {"type": "float"}},
                "opts": {
                    "type": "dict",
                    "properties": {"deep": {"type": "array", "items": {"type": "dict"}}},
                },
                "anything": {"type": "any", "description": "whatever"},
                "where": {"type": "string", "default": "None"},
            },
            "required": ["x"],
        },
        "response": {"type": "dict", "properties": {}},
    }
    spec = to_tool_spec(doc)
    assert spec.name == "f" and spec.description == "Does f."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "x": {"type": "number", "description": "a number"},
            "pair": {"type": "array", "items": {"type": "number"}},
            "opts": {
                "type": "object",
                "properties": {"deep": {"type": "array", "items": {"type": "object"}}},
            },
            "anything": {"description": "whatever"},
            "where": {"type": "string", "default": None},
        },
        "required": ["x"],
    }
    assert convert_schema("not a schema") == "not a schema"


async def test_a_task_shows_the_docs_of_its_classes_less_its_excluded_functions(tasks):
    task = tasks[0]  # TwitterAPI + GorillaFileSystem, cp excluded
    env = BfclEnv()
    messages = await env.reset(task)
    names = {t.name for t in env.tools}
    assert {"post_tweet", "cd", "mv", "grep"} <= names and "cp" not in names
    assert not names & {"buy_stock", "book_flight", "startEngine"}
    schemas = json.dumps([t.parameters for t in env.tools])
    assert '"dict"' not in schemas and '"float"' not in schemas
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[1].content == task.data["query"] == task.data["turns"][0][0]["content"]
    # an excluded function still executes when called, as in BFCL
    result = await env.step(Action(text="", tool_calls=[call("cd", folder="document")]))
    result = await env.step(
        Action(text="", tool_calls=[call("cp", source="final_report.pdf", destination="x")])
    )
    assert "Error" not in result.observations[0].content


# ---------------------------------------------------------------------------------------------------
def test_call_strings_parse_with_keyword_positional_and_nested_literal_arguments():
    signatures = task_signatures(["GorillaFileSystem", "TwitterAPI"])
    assert parse_call("cd(folder='document')") == {"name": "cd", "arguments": {"folder": "document"}}
    assert parse_call("sort('final_report.pdf')", signatures) == {
        "name": "sort",
        "arguments": {"file_name": "final_report.pdf"},
    }
    nested = parse_call("post_tweet(content='hi', tags = ['#a', '#b'], mentions=[])", signatures)
    assert nested["arguments"] == {"content": "hi", "tags": ["#a", "#b"], "mentions": []}
    assert parse_call("f(x={'a': [1, -2.5, (3, None)]}, y=True)")["arguments"] == {
        "x": {"a": [1, -2.5, (3, None)]},
        "y": True,
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cd(folder='a'", "is not Python"),
        ("cd", "is not a call of a function name"),
        ("os.remove('x')", "is not a call of a function name"),
        ("cd(folder=open('x'))", "argument \"open('x')\" is not a Python literal"),
        ("cd(**kw)", "**-arguments are not supported"),
        ("mystery('x')", "positional arguments of unknown function 'mystery'"),
        ("cd('a', 'b')", "cd takes at most 1 positional arguments"),
        ("cd('a', folder='b')", "argument 'folder' is given twice"),
    ],
)
def test_a_bad_call_string_is_a_clear_error(text, message):
    with pytest.raises(CallParseError) as info:
        parse_call(text, task_signatures(["GorillaFileSystem"]))
    assert message in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------
async def test_the_oracle_solves_tasks_through_the_agent_loop(tokenizer, tasks):
    agent = agent_for(tokenizer)
    # file system + Twitter, car + MathAPI, trading + tickets, travel with ground-truth-empty turns
    for task in (tasks[0], tasks[80], tasks[110], tasks[167]):
        traj = await agent.run(BfclEnv(), task, f"{task.id}#0", task.id, policy=BfclEnv.oracle())
        assert traj.finish == "finished" and traj.reward == 1.0 and traj.success, task.id
        turns = len(task.data["turns"])
        assert traj.metrics["turns_passed"] == traj.metrics["turns_total"] == turns
        calls = sum(len(t) for t in task.data["reference_solution"])
        assert traj.num_turns == calls + turns  # one reply per call and a text reply per user turn
        users = [m.content for m in traj.messages if m.role == "user"]
        assert users == [m["content"] for turn in task.data["turns"] for m in turn]
        assert all(
            m.content == END_OF_TURN for m in traj.messages if m.role == "assistant" and not m.tool_calls
        )


def test_eval_with_the_oracle_scores_every_task(tmp_path):
    """``horizon eval configs/bfcl.yaml --policy oracle``: all 200 multi_turn_base tasks pass."""
    from typer.testing import CliRunner

    from horizonrl.cli import app

    summary = tmp_path / "summary.json"
    args = [
        "eval",
        "configs/bfcl.yaml",
        "--policy",
        "oracle",
        "--json",
        str(summary),
        f"output_dir={tmp_path}",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(summary.read_text())
    assert figures["success_rate"] == 1.0 and figures["num_trajectories"] == 200


async def test_a_wrong_call_fails_its_turn_and_ends_the_episode(tokenizer, scripted_engine, tasks):
    task = tasks[0]  # turn 0: cd document, mkdir temp, mv final_report.pdf temp
    engine = scripted_engine(
        [
            format_tool_call("cd", {"folder": "document"}),
            format_tool_call("mkdir", {"dir_name": "tmp"}),  # the wrong name
            format_tool_call("mv", {"source": "final_report.pdf", "destination": "tmp"}),
            "I moved it.",
            format_tool_call("cd", {"folder": "tmp"}),
        ]
    )
    traj = await agent_for(tokenizer, engine).run(BfclEnv(), task, "t#0", "t")
    assert traj.finish == "finished" and traj.reward == 0.0 and not traj.success
    assert traj.num_turns == 4 and engine.calls == 4  # nothing after the failed turn
    assert traj.metrics["turns_passed"] == 0 and traj.metrics["turns_total"] == 4
    assert [m.role for m in traj.messages].count("user") == 1


async def test_a_turn_without_a_call_fails_and_a_turn_budget_cut_fails(tokenizer, scripted_engine, tasks):
    env = BfclEnv()
    await env.reset(tasks[0])
    result = await env.step(Action(text="Sure, done!"))
    assert result.done and result.reward == 0.0
    assert result.info["turn_reason"] == "no tool call in this turn"
    assert await env.evaluate() == 0.0

    # the oracle with too few turns: every turn it played passed, but not all were checked
    traj = await agent_for(tokenizer, max_turns=5).run(
        BfclEnv(), tasks[0], "t#0", "t", policy=BfclEnv.oracle()
    )
    assert traj.finish == "turn_budget" and traj.reward == 0.0 and traj.metrics["turns_passed"] == 1


async def test_a_failing_tool_is_an_error_observation_and_the_episode_goes_on(tasks, monkeypatch):
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system import GorillaFileSystem

    def broken(self, *args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(GorillaFileSystem, "ls", broken)
    env = BfclEnv()
    await env.reset(tasks[0])
    result = await env.step(
        Action(
            text="",
            tool_calls=[
                call("ls"),
                call("cd", directory="document"),
                call("teleport", to="mars"),
                call("cd", folder="nowhere"),
            ],
        )
    )
    contents = [m.content for m in result.observations]
    assert contents[0] == "Error during execution: disk on fire"
    assert contents[1] == (
        "Error during execution: GorillaFileSystem.cd() got an unexpected keyword argument 'directory'"
    )
    assert contents[2] == "Error during execution: name 'teleport' is not defined"
    assert json.loads(contents[3]) == {"error": "cd: 'nowhere': No such file or directory"}
    assert [m.role for m in result.observations] == ["tool"] * 4
    assert [m.tool_call_id for m in result.observations] == ["c_ls", "c_cd", "c_teleport", "c_cd"]
    assert not result.done and result.info["tool_errors"] == 3 and env.metrics["world_errors"] == 1


def test_math_arguments_that_would_stall_the_loop_are_refused():
    episode = BfclEpisode(["MathAPI"], {}, [[]])
    assert episode.execute("power", {"base": 2, "exponent": 10**9}).text.startswith("Error during execution")
    assert episode.execute("square_root", {"number": 2.0, "precision": 10**8}).raised
    # a whole number written as a float runs as long (an explorer drew 7546009.0 from a result)
    assert episode.execute("logarithm", {"value": 5.0, "base": 2.0, "precision": 7546009.0}).raised
    assert episode.execute("power", {"base": 7546009.0, "exponent": 2747.0e3}).raised
    assert json.loads(episode.execute("power", {"base": 2, "exponent": 10}).text) == {"result": 1024}


def test_tasks_are_multi_turn_base_in_file_order(tasks):
    cls = get_env_class("bfcl")
    assert cls is BfclEnv and cls.splits() == ("test",) and cls.accepts_text
    assert [t.id for t in tasks[:3]] == ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]
    assert len(tasks) == 200 and {t.split for t in tasks} == {"test"} and {t.env for t in tasks} == {"bfcl"}
    data = tasks[0].data
    assert set(data) >= {
        "query",
        "turns",
        "initial_config",
        "involved_classes",
        "excluded_function",
        "ground_truth",
        "reference_solution",
    }
    assert data["ground_truth"][2] == ["sort('final_report.pdf')"]
    assert data["reference_solution"][2] == [{"name": "sort", "arguments": {"file_name": "final_report.pdf"}}]
    with pytest.raises(ConfigError, match="has 200 multi_turn_base tasks, 201 were asked for"):
        cls.make_tasks("test", 201, 0, OPTIONS)
    with pytest.raises(ConfigError, match="unknown split 'train' for env 'bfcl'; valid splits: test"):
        cls.make_tasks("train", 1, 0, OPTIONS)


async def test_without_bfcl_eval_the_error_is_one_line_naming_the_install(tasks, monkeypatch):
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # import bfcl_eval now fails
    with pytest.raises(ConfigError) as made:
        BfclEnv.make_tasks("test", 1, 0, OPTIONS)
    with pytest.raises(ConfigError) as reset:
        await BfclEnv().reset(tasks[0])
    for info in (made, reset):
        message = str(info.value)
        assert message == "env 'bfcl' needs the bfcl-eval package: " + INSTALL
    assert get_env_class("bfcl") is BfclEnv  # the env stays registered


# --------------------------------------------------------------------------------------- agreement
_names = itertools.count()


def our_verdict(task, turns: list[list[list[str]]]) -> bool:
    """Our episode logic on per-turn steps of call strings (each step: one reply's calls)."""
    data = task.data
    signatures = task_signatures(data["involved_classes"])
    episode = BfclEpisode(data["involved_classes"], data["initial_config"], data["reference_solution"])
    for steps in turns:
        for step in steps:
            for text in step:
                parsed = parse_call(text, signatures)
                episode.execute(parsed["name"], parsed["arguments"])
        if not episode.end_turn().valid:
            return False
    return episode.passed


def their_verdict(task, turns: list[list[list[str]]]) -> bool:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    data = task.data
    entry = {
        "id": task.id,
        "initial_config": data["initial_config"],
        "involved_classes": data["involved_classes"],
    }
    # the checker caches its API instances by model name and task id: a fresh name per call
    model_name = f"horizon_agreement_{next(_names)}"
    return multi_turn_checker(turns, data["ground_truth"], entry, "multi_turn_base", model_name)["valid"]


def _changed(text: str, rng: random.Random) -> str | None:
    """``text`` with one argument value changed, or None when it has none to change."""
    node = ast.parse(text, mode="eval").body
    assert isinstance(node, ast.Call)
    slots = [(node.args, i) for i in range(len(node.args))] + [(k, None) for k in node.keywords]
    if not slots:
        return None
    holder, index = rng.choice(slots)
    value = ast.literal_eval(holder[index] if index is not None else holder.value)
    if isinstance(value, bool):
        new = not value
    elif isinstance(value, int | float):
        new = value + 1
    elif isinstance(value, str):
        new = value + "_x"
    elif isinstance(value, list):
        new = value[:-1] if value else ["x"]
    else:
        return None
    expr = ast.parse(repr(new), mode="eval").body
    if index is not None:
        holder[index] = expr
    else:
        holder.value = expr
    return ast.unparse(node)


def _cases(task, rng: random.Random):
    """(name, per-turn steps of call strings): the ground truth and perturbations of it."""
    truth = task.data["ground_truth"]

    def one_per_step(turns):
        return [[[c] for c in turn] for turn in turns]

    def copy_():
        return [list(turn) for turn in truth]

    nonempty = [i for i, turn in enumerate(truth) if turn]
    yield "ground truth, one call per step", one_per_step(truth)
    yield "ground truth, one step per turn", [[turn] if turn else [] for turn in truth]
    i = rng.choice(nonempty)
    j = rng.randrange(len(truth[i]))
    turns = copy_()
    del turns[i][j]
    yield "drop a call", one_per_step(turns)
    changed = _changed(truth[i][j], rng)
    if changed is not None:
        turns = copy_()
        turns[i][j] = changed
        yield "change an argument", one_per_step(turns)
    turns = copy_()
    turns[i].insert(j + 1, truth[i][j])
    yield "repeat a call", one_per_step(turns)
    turns = copy_()
    turns[i].insert(j, "no_such_tool(x=1)")
    yield "an unknown tool", one_per_step(turns)
    if len(truth) > 1:
        k = rng.randrange(len(truth) - 1)
        turns = copy_()
        turns[k + 1], turns[k] = turns[k] + turns[k + 1], []
        yield "move a turn's calls to the next turn", one_per_step(turns)
    turns = copy_()
    turns[i] = []
    yield "an empty turn", one_per_step(turns)


def test_our_verdicts_agree_with_bfcl_evals_checker(tasks):
    # every tenth task (all eight classes) and the two with ground-truth-empty turns
    sample = [tasks[k] for k in [*range(0, 200, 10), 167, 180]]
    classes = {c for t in sample for c in t.data["involved_classes"]}
    assert len(classes) == 8
    verdicts: dict[str, list[bool]] = {}
    for k, task in enumerate(sample):
        for name, turns in _cases(task, random.Random(k)):
            theirs = their_verdict(task, turns)
            assert our_verdict(task, turns) == theirs, f"{task.id}: {name}: {turns}"
            verdicts.setdefault(name, []).append(theirs)
    assert all(verdicts["ground truth, one call per step"]) and all(
        verdicts["ground truth, one step per turn"]
    )
    assert not any(verdicts["drop a call"]) and not any(verdicts["an empty turn"])
    assert not all(verdicts["change an argument"]) and not all(
        verdicts["move a turn's calls to the next turn"]
    )


def test_the_hand_written_profile_names_every_function_of_the_loaded_classes():
    """`horizon evolve profile bfcl` reads the shipped profile (no bfcl-eval needed for it): one entity
    per loaded API class, whose operations are exactly that class's functions."""
    from horizonrl.envs.api.bfcl_world import CLASSES
    from horizonrl.evolve.profile import env_profile

    profile = env_profile("bfcl")
    assert profile.name == "bfcl" and len(profile.entities) == len(CLASSES) == 8
    functions = {name: {doc["name"] for doc in class_docs(name)} for name in CLASSES}
    for entity in profile.entities:
        owner = [name for name in CLASSES if f"({name})" in entity.description]
        assert len(owner) == 1, f"entity {entity.name!r} names no loaded class"
        assert sorted(entity.operations) == sorted(functions[owner[0]]), entity.name
    assert set(profile.task_preferences) == {"easy", "medium", "hard"}


# ---------------------------------------------------------------------------------------- world sessions
def _synthesized(reference, checker, query="Create the file notes.txt.", world_seed=0):
    from horizonrl.types import Task

    data = {"query": query, "reference_solution": reference, "checker": checker, "world_seed": world_seed}
    return Task(id="bfcl-synth", env="bfcl", split="train", data=data)


NOTES = {
    "exists": "GorillaFileSystem.files",
    "where": {"all": [{"field": "name", "op": "eq", "value": "notes.txt"}]},
}


async def test_a_world_session_shows_every_class_and_its_state_as_fields_and_collections():
    from horizonrl.envs.api.bfcl_state import OpenRecord
    from horizonrl.evolve.explore import exploration_task

    env = BfclEnv()
    await env.reset(exploration_task("e", "bfcl", 0))
    assert len({t.name for t in env.tools}) == 128  # the eight classes' functions, no duplicates
    before = env.world_state()
    assert isinstance(env.state_schema["GorillaFileSystem.files"], OpenRecord)
    assert env.state_schema["VehicleControlAPI.engine_state"] == "string"
    assert env.state_schema["TicketAPI.ticket_queue"] == {"key": "string"}  # empty, still a collection
    assert "TwitterAPI.tweet_counter" in env.assigned_fields[""]
    result = await env.step(
        Action(text="", tool_calls=[ToolCall(id="1", name="touch", arguments={"file_name": "n.txt"})])
    )
    assert not result.done and result.observations[0].content == "None"
    refused = await env.step(
        Action(text="", tool_calls=[ToolCall(id="2", name="post_tweet", arguments={"content": "x"})])
    )
    assert (
        refused.observations[0].content.startswith("Error: ")
        and "authenticate" in refused.observations[0].content
    )
    after = env.world_state()
    new = [f for f in after["GorillaFileSystem.files"] if f not in before["GorillaFileSystem.files"]]
    assert [f["name"] for f in new] == ["n.txt"] and new[0]["path"].endswith("/n.txt")


async def test_synthesized_bfcl_tasks_are_validated_by_replay():
    from horizonrl.evolve.validate import replay

    touch = [{"name": "touch", "arguments": {"file_name": "notes.txt"}}]
    assert (await replay(BfclEnv, _synthesized(touch, NOTES))).valid
    wrong = [{"name": "mkdir", "arguments": {"dir_name": "notes.txt"}}]
    assert (await replay(BfclEnv, _synthesized(wrong, NOTES))).reason == "checker_fails"
    refused = [{"name": "post_tweet", "arguments": {"content": "hi"}}]  # before authenticate_twitter
    tweet = {
        "exists": "TwitterAPI.tweets",
        "where": {"all": [{"field": "content", "op": "eq", "value": "hi"}]},
    }
    assert (await replay(BfclEnv, _synthesized(refused, tweet))).reason == "call_failed"
    other_world = (await replay(BfclEnv, _synthesized(refused, NOTES))).reason  # names a class not loaded
    assert other_world == "bad_checker"
    unknown = {"field": "GorillaFileSystem.colour", "op": "eq", "value": 1}
    assert (await replay(BfclEnv, _synthesized(touch, unknown))).reason == "bad_checker"
    bad_world = _synthesized(touch, NOTES, world_seed="first")
    verdict = await replay(BfclEnv, bad_world)
    assert verdict.reason == "bad_checker" and "world_seed must be an integer" in verdict.detail
    assert (await replay(BfclEnv, _synthesized([{"name": "fly", "arguments": {}}], NOTES))).reason in (
        "unknown_tool",
        "bad_checker",
    )


async def test_a_synthesized_task_is_an_episode_the_checker_scores_and_the_oracle_solves():
    from horizonrl.envs.api.bfcl import owning_classes

    touch = [{"name": "touch", "arguments": {"file_name": "notes.txt"}}]
    assert owning_classes(touch) == ["GorillaFileSystem"]
    task = _synthesized(touch, NOTES)
    env = BfclEnv()
    messages = await env.reset(task)
    assert {t.name for t in env.tools} == {d["name"] for d in class_docs("GorillaFileSystem")}
    oracle = BfclEnv.oracle()
    reply = oracle.act(task, messages)
    assert reply == format_tool_call("touch", {"file_name": "notes.txt"})
    await env.step(
        Action(text="", tool_calls=[ToolCall(id="1", name="touch", arguments={"file_name": "notes.txt"})])
    )
    messages += [Message(role="assistant", content=reply), Message(role="tool", content="None")]
    assert oracle.act(task, messages) == END_OF_TURN
    end = await env.step(Action(text=END_OF_TURN))
    assert end.done and end.reward == 1.0 and env.metrics["success"] == 1.0


async def test_self_questioning_runs_in_bfcl_worlds_and_is_deterministic():
    from horizonrl.evolve.config import ExploreConfig
    from horizonrl.evolve.profile import env_profile
    from horizonrl.evolve.synthesize import synthesize
    from horizonrl.evolve.validate import replay
    from horizonrl.evolve.walk import walk

    config = ExploreConfig(
        explorer="walk", synthesizer="template", worlds=20, breadth_probes=1, breadth_steps=3,
        depth_sessions=40, depth_steps=8, focused=True, jaccard_duplicate=1.0, embedding_duplicate=None,
    )  # fmt: skip
    profile = env_profile("bfcl")
    traces = await walk(BfclEnv, profile, config, seed=0)
    tasks, report = await synthesize(None, BfclEnv, profile, traces, config, seed=0)
    assert tasks and report.kept == len(tasks)
    for task in tasks:
        assert (await replay(BfclEnv, task)).valid
        calls = task.data["reference_solution"]
        assert all(v != "" for c in calls for v in c["arguments"].values())
        assert "." not in task.data["query"].split(" should be")[0].split()[1]  # no "Class.field" in words
    again, _ = await synthesize(None, BfclEnv, profile, await walk(BfclEnv, profile, config, seed=0), config)
    assert [t.data for t in again] == [t.data for t in tasks]


def test_a_directory_inside_itself_is_listed_once():
    from horizonrl.envs.api.bfcl_state import state_view
    from horizonrl.envs.api.bfcl_world import BfclWorld

    world = BfclWorld(["GorillaFileSystem"], {})
    assert not world.call("mkdir", {"dir_name": "d"}).raised
    root = world.instances["GorillaFileSystem"].root
    child = root.contents["d"]
    child.contents["loop"] = root  # what mv/cp into a subdirectory can leave
    state = state_view(world.instances)
    assert len(state["GorillaFileSystem.directories"]) < 200
