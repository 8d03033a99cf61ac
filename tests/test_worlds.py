"""Layered worlds: the DSL, the observation and skin layers, the world env, validation, generation in
sandboxes, and the bad input each part refuses."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from horizonrl.errors import ConfigError, DataError
from horizonrl.roles.structured import parse_reply
from horizonrl.types import Action, Task, ToolCall
from horizonrl.worlds.dsl import load_spec, parse_spec
from horizonrl.worlds.env import WorldEnv, WorldOptions
from horizonrl.worlds.generate import draft_of, draft_to_spec, funnel, generate_world
from horizonrl.worlds.package import open_world, shipped_names, shipped_root
from horizonrl.worlds.runner import InProcessRunner, SandboxRunner
from horizonrl.worlds.validate import validate_world
from horizonrl.worlds.worldlib import View, observe

MAZE = shipped_root() / "maze"


def run(coro):
    return asyncio.run(coro)


def maze_yaml() -> dict:
    return yaml.safe_load((MAZE / "world.yaml").read_text())


def copy_maze(tmp_path: Path, name: str = "mymaze") -> Path:
    root = tmp_path / name
    shutil.copytree(MAZE, root)
    return root


# ------------------------------------------------------------------ the DSL


def test_a_dsl_key_that_does_not_exist_is_named_with_the_valid_keys():
    data = maze_yaml()
    data["transition"]["actions"]["move"]["parms"] = data["transition"]["actions"]["move"].pop("params")
    with pytest.raises(ConfigError) as err:
        parse_spec(data, "world.yaml")
    msg = str(err.value)
    assert "transition.actions.move.parms" in msg and "description, params" in msg
    assert "\n" not in msg

    data = maze_yaml()
    data["rewards"] = data.pop("reward")
    with pytest.raises(ConfigError, match=r"unknown key 'rewards'.*valid keys here: .*reward"):
        parse_spec(data, "world.yaml")


def test_dsl_values_are_checked_where_they_are_wrong():
    data = maze_yaml()
    data["axes"]["skill"] = "juggling"
    with pytest.raises(ConfigError, match=r"axes\.skill: .*navigation"):
        parse_spec(data, "world.yaml")
    data = maze_yaml()
    data["skin"]["variants"]["inverse"]["names"].pop("goal")
    with pytest.raises(ConfigError, match="only what things are called"):
        parse_spec(data, "world.yaml")
    data = maze_yaml()
    data["reward"]["kind"] = "cumulative"
    with pytest.raises(ConfigError, match=r"differs from axes\.reward"):
        parse_spec(data, "world.yaml")


def test_every_shipped_world_parses_and_the_set_covers_autoenvs_axes():
    packages = [open_world(n) for n in shipped_names()]
    assert len(packages) >= 12
    axes = [p.spec.axes for p in packages]
    assert {a.skill for a in axes} == {"navigation", "memory", "resource", "pattern", "planning"}
    assert {a.reward for a in axes} == {"binary", "cumulative"}
    assert {a.observation for a in axes} == {"full", "partial"}
    assert sum("inverse" in p.spec.skin.variants for p in packages) >= 10
    for p in packages:
        assert len(p.levels("train")) == 10 and len(p.levels("val")) == 5, p.name


# ------------------------------------------------------------------ observation and skin layers

GRID = ["#######", "#.....#", "#.###.#", "#.#E#.#", "#.....#", "#######"]


def test_radius_observation_hides_cells_beyond_the_radius_only():
    seen = observe(View(grid=GRID, agent=(1, 1)), {"kind": "radius", "radius": 1})
    assert seen.grid is not None
    for r, row in enumerate(seen.grid):
        for c, ch in enumerate(row):
            near = max(abs(r - 1), abs(c - 1)) <= 1
            assert (ch == GRID[r][c]) if near else ch == "?"


def test_line_of_sight_hides_what_walls_block():
    seen = observe(View(grid=GRID, agent=(1, 1)), {"kind": "line_of_sight", "opaque": "#"})
    assert seen.grid is not None
    assert seen.grid[3][3] == "?"  # the exit sits behind the wall block
    assert seen.grid[1][5] == "."  # straight along the open corridor
    assert seen.grid[2][2] == "#"  # a wall itself is seen


def test_mask_hides_a_seeded_share_and_full_hides_nothing():
    view = View(grid=GRID, agent=(1, 1), facts={f"f{i}": i for i in range(40)})
    a = observe(view, {"kind": "mask", "p": 0.5}, step=3, seed=7)
    b = observe(view, {"kind": "mask", "p": 0.5}, step=3, seed=7)
    assert a == b and 5 < len(a.facts) < 35
    assert a.grid is not None and any("?" in row for row in a.grid) and a.grid[1][1] == "."
    assert observe(view, {"kind": "full"}) == view


def maze_task(index: int = 0) -> Task:
    return Task(
        id=f"maze/train/{index}",
        env="world",
        split="train",
        data={"world": "maze", "split": "train", "index": index},
    )


async def play_plan(options: WorldOptions, task: Task) -> tuple[list[str], list[float], dict]:
    env = WorldEnv(options)
    try:
        texts = [m.content for m in await env.reset(task)]
        rewards = []
        for i, (name, args) in enumerate(open_world("maze").levels("train")[0].plan):
            res = await env.step(
                Action(text="", tool_calls=[ToolCall(id=f"c{i}", name=name, arguments=args)])
            )
            texts += [m.content for m in res.observations]
            rewards.append(res.reward)
            if res.done:
                break
        return texts, rewards, dict(env.metrics)
    finally:
        await env.close()


def test_an_inverse_skin_changes_only_the_text():
    aligned = run(play_plan(WorldOptions(world="maze", skin="aligned"), maze_task()))
    inverse = run(play_plan(WorldOptions(world="maze", skin="inverse"), maze_task()))
    assert aligned[1] == inverse[1] and aligned[2] == inverse[2]  # same rewards, same outcome
    assert aligned[2]["success"] == 1.0 and aligned[2]["normalized_reward"] == 1.0
    assert aligned[0] != inverse[0]
    assert "pit" in inverse[0][0] and "pit" not in aligned[0][0]
    assert "exit" in aligned[0][-1]


def test_a_world_in_a_sandbox_answers_exactly_as_in_process():
    package = open_world("maze")
    record = package.levels("val")[1]
    cmd = {
        "op": "reset",
        "level": record.level,
        "seed": record.seed,
        "obs": {"kind": "radius", "radius": 2},
        "skin": package.skin("inverse"),
        "max_steps": 40,
    }

    async def both():
        boxed = SandboxRunner(package)
        try:
            return await boxed.call(cmd), await InProcessRunner(package).call(cmd)
        finally:
            await boxed.aclose()

    boxed, local = run(both())
    assert boxed == local and "?" in boxed["text"]


# ------------------------------------------------------------------ the world env


def test_bad_actions_become_error_observations_and_the_episode_goes_on():
    async def go():
        env = WorldEnv(WorldOptions(world="maze"))
        try:
            await env.reset(maze_task())
            calls = [
                ToolCall(id="a", name="move", arguments={"direction": "up"}),
                ToolCall(id="b", name="move", arguments={}),
                ToolCall(id="c", name="jump", arguments={}),
                ToolCall(id="d", name="move", arguments={"direction": "north", "speed": 2}),
            ]
            res = await env.step(Action(text="", tool_calls=calls))
            return [m.content for m in res.observations], res.done, env.metrics
        finally:
            await env.close()

    texts, done, metrics = run(go())
    assert texts[0].startswith("Error: move: direction must be one of north, south, east, west (got 'up')")
    assert "needs argument 'direction'" in texts[1]
    assert "unknown action 'jump'; actions: move" in texts[2]
    assert "takes no argument 'speed'" in texts[3]
    assert not done and metrics["world_errors"] == 4 and metrics["steps"] == 0


def test_tasks_cover_every_level_and_a_missing_skin_is_refused():
    tasks = WorldEnv.make_tasks("test", 65, 0, WorldOptions(world="all"))
    assert len({t.id for t in tasks}) == 65 == len(shipped_names()) * 5
    assert {t.data["split"] for t in tasks} == {"val"}
    with pytest.raises(ConfigError, match="has no skin 'inverse'; its skins: aligned"):
        WorldEnv.make_tasks("val", 5, 0, WorldOptions(world="hanoi", skin="inverse"))
    with pytest.raises(ConfigError, match=r"unknown world 'mazes'\. Did you mean 'maze'"):
        WorldEnv.make_tasks("val", 5, 0, WorldOptions(world="mazes"))


def test_the_oracle_reaches_the_max_on_every_level_through_the_agent_loop(tmp_path):
    out = tmp_path / "oracle.jsonl"
    summary = tmp_path / "summary.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "horizonrl.cli",
            "eval",
            "configs/worlds.yaml",
            "--policy",
            "oracle",
            "agent.max_turns=40",
            "agent.max_total_tokens=16384",
            f"output_dir={tmp_path}",
            "--out",
            str(out),
            "--json",
            str(summary),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    worlds = json.loads(summary.read_text())["worlds"]
    assert len(worlds["per_world"]) == len(shipped_names())
    assert all(w["normalized_reward"] == 1.0 for w in worlds["per_world"].values())
    assert worlds["mean"] == 1.0 and "skill=navigation" in worlds["by_axis"]
    assert "mean normalized_reward=1.000 over 13 worlds" in done.stdout


# ------------------------------------------------------------------ bad world packages


def test_a_malformed_world_directory_is_one_clear_error(tmp_path):
    root = copy_maze(tmp_path)
    (root / "world.py").unlink()
    with pytest.raises(ConfigError, match=r"is not a world directory: it has no world\.py"):
        open_world(str(root))
    with pytest.raises(ConfigError, match="is a file"):
        open_world(str(MAZE / "world.yaml"))


def test_a_level_file_that_violates_the_schema_names_the_line(tmp_path):
    root = copy_maze(tmp_path)
    lines = (root / "levels" / "val.jsonl").read_text().splitlines()
    broken = json.loads(lines[2])
    del broken["max_reward"]
    lines[2] = json.dumps(broken)
    (root / "levels" / "val.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"val\.jsonl:3: not a level record \(max_reward: Field required\)"):
        open_world(str(root)).levels("val")


def test_validation_rejects_an_unsolvable_level(tmp_path):
    root = copy_maze(tmp_path)
    path = root / "levels" / "train.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    level = records[0]["level"]
    er, ec = level["exit"]
    grid = [list(row) for row in level["grid"]]
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        if grid[er + dr][ec + dc] == ".":
            grid[er + dr][ec + dc] = "#"  # wall the exit in
    level["grid"] = ["".join(row) for row in grid]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = run(validate_world(open_world(str(root)), steps=20))
    assert report.execution.ok and not report.levels.ok and not report.valid
    problems = " ".join(report.levels.problems)
    assert "train[0]: the generator makes another level" in problems
    assert "train[0]: max reward 0.0 computed, 1.0 stored" in problems


def test_validate_all_reports_every_shipped_world_valid():
    done = subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", "worlds", "validate", "--all", "--react-steps", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    n = len(shipped_names())
    assert done.stdout.strip().splitlines()[-1] == f"valid={n}/{n}"


class ScriptedCoder:
    """Scripted replies in order (a stand-in for a capable coder model, which this machine cannot run)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.seen: list[list] = []

    async def chat(self, messages, **sampling) -> str:
        self.seen.append(list(messages))
        return self.replies.pop(0)

    async def structured(self, messages, schema, **sampling):
        return parse_reply(await self.chat(messages, **sampling), schema)


class ScriptedExplorer(ScriptedCoder):
    async def chat(self, messages, **sampling) -> str:
        self.seen.append(list(messages))
        return self.replies[(len(self.seen) - 1) % len(self.replies)]


def test_the_execution_stage_runs_a_react_agent_and_counts_what_it_cannot_read():
    reply_ok = (
        'Thought: go.\n<tool_call>\n{"name": "move", "arguments": {"direction": "south"}}\n</tool_call>'
    )
    explorer = ScriptedExplorer([reply_ok, "I am not sure.", reply_ok])
    report = run(validate_world(open_world("maze"), steps=10, react=explorer, react_steps=6))
    figures = report.execution.figures
    assert report.execution.ok and figures["react_steps"] == 4 and figures["react_malformed"] == 2
    assert "Thought:" in explorer.seen[0][0].content and "# Tools" in explorer.seen[0][0].content


def candidate_code(variant: str) -> str:
    code = (MAZE / "world.py").read_text()
    if variant == "syntax":
        return code.replace("def generate(cls, rng, params):", "def generate(cls, rng, params)")
    if variant == "unsolvable":  # the exit is walled in: generation runs, no level can be won
        return code.replace(
            'grid[far[0]][far[1]] = "E"',
            'grid[far[0]][far[1]] = "E"\n        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):\n'
            '            if grid[far[0] + dr][far[1] + dc] == ".":\n'
            '                grid[far[0] + dr][far[1] + dc] = "#"',
        )
    if variant == "read_project":
        return code.replace(
            "    def generate(cls, rng, params):\n",
            f"    def generate(cls, rng, params):\n        open({str(Path(__file__).resolve())!r}).read()\n",
        )
    if variant == "socket":
        return code.replace(
            "    def generate(cls, rng, params):\n",
            "    def generate(cls, rng, params):\n        import socket\n"
            "        socket.create_connection(('pypi.org', 443), timeout=3)\n",
        )
    if variant == "hang":
        return code.replace(
            "    def generate(cls, rng, params):\n",
            "    def generate(cls, rng, params):\n        while True: pass\n",
        )
    return code


def fence(lang: str, body: str) -> str:
    return f"Here it is.\n```{lang}\n{body}```\n"


def coder_for(*codes: str) -> ScriptedCoder:
    dsl = (MAZE / "world.yaml").read_text()
    return ScriptedCoder(["A maze to walk out of.", fence("yaml", dsl), *[fence("python", c) for c in codes]])


def test_generation_takes_a_valid_candidate_through_every_stage(tmp_path):
    cand = run(generate_world("a hedge maze", coder_for(candidate_code("valid")), tmp_path))
    assert cand.reached == "reliable" and cand.repairs == 0, cand.problems
    root = Path(cand.path)
    assert (root / "generated.json").exists() and len(open_world(str(root)).levels("val")) == 5
    with pytest.raises(Exception, match="runs only sandboxed"):
        InProcessRunner(open_world(str(root)))


def test_generation_repairs_a_syntax_error_with_the_coders_next_reply(tmp_path):
    coder = coder_for(candidate_code("syntax"), candidate_code("valid"))
    cand = run(generate_world("a hedge maze", coder, tmp_path))
    assert cand.reached == "reliable" and cand.repairs == 1
    assert "SyntaxError" in cand.problems[0]
    assert "That failed" in coder.seen[-1][-1].content and "SyntaxError" in coder.seen[-1][-1].content


def test_generation_stops_a_candidate_whose_levels_cannot_be_won(tmp_path):
    cand = run(
        generate_world("a sealed maze", coder_for(candidate_code("unsolvable")), tmp_path, max_repairs=0)
    )
    assert cand.stages.get("executable") and not cand.stages.get("levels_valid")
    assert cand.reached == "executable" and "cannot be won" in cand.problems[-1]
    assert funnel([cand]) == {
        "tried": 1,
        "described": 1,
        "dsl_valid": 1,
        "executable": 1,
        "levels_valid": 0,
        "reliable": 0,
    }


@pytest.mark.parametrize(
    ("variant", "why"), [("read_project", "FileNotFoundError"), ("socket", "OSError|gaierror")]
)
def test_generated_code_cannot_reach_the_host(tmp_path, variant, why):
    cand = run(generate_world("a nosy maze", coder_for(candidate_code(variant)), tmp_path, max_repairs=0))
    assert cand.reached == "dsl_valid"
    assert any(("generate failed" in p) for p in cand.problems), cand.problems
    import re

    assert re.search(why, cand.problems[-1]), cand.problems[-1]


def test_a_generated_world_that_hangs_times_out_and_is_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(SandboxRunner.call, "__defaults__", (2.0,))
    cand = run(
        generate_world("a maze without end", coder_for(candidate_code("hang")), tmp_path, max_repairs=0)
    )
    assert cand.reached == "dsl_valid" and cand.timed_out == 1
    assert "timed out after 2 s" in cand.problems[-1]


def test_a_world_draft_is_the_dsl_with_lists_for_mappings():
    spec = parse_spec(yaml.safe_load((shipped_root() / "keys_doors" / "world.yaml").read_text()), "w")
    back = parse_spec(draft_to_spec(draft_of(spec), "keys_doors"), "w").model_dump()
    shipped = spec.model_dump()
    assert back["generator"]["seed"] == 0 and shipped["generator"]["seed"] == 21  # the draft has none
    for data in (back, shipped):
        data["generator"].pop("seed")
        data["description"] = " ".join(data["description"].split())
    assert back == shipped
    draft = draft_of(spec)
    twice = draft.model_copy(update={"actions": draft.actions * 2, "state": draft.state * 2})
    notes: list[str] = []
    assert draft_to_spec(twice, "keys_doors", notes) == draft_to_spec(draft, "keys_doors")
    assert notes[0] == "a repeated action 'move' was dropped" and len(notes) == 4  # 2 actions, 2 keys


def test_generation_reads_the_dsl_as_a_structured_draft(tmp_path):
    spec = parse_spec(maze_yaml(), "world.yaml")
    coder = ScriptedCoder(["A maze.", "Sorry, no.", draft_of(spec).model_dump_json(), "no code"])
    cand = run(generate_world("a hedge maze", coder, tmp_path, max_repairs=1))
    assert cand.stages["dsl_valid"] and cand.reached == "dsl_valid" and cand.repairs == 1
    assert cand.problems[0].startswith("the reply is no WorldDraft (no JSON object in the reply)")
    assert cand.unparsed_replies == 2  # the prose, and the code stage's "no code"
    written = load_spec(Path(cand.path) / "world.yaml")
    assert written.name == "a_hedge_maze" and written.transition == spec.transition
    assert '"observation_policy"' in coder.seen[1][-1].content  # the request names what to write


def test_the_coder_on_an_engine_always_writes_a_valid_dsl(tmp_path, tiny_model_and_tokenizer):
    """The policy coder (a random model, held to the draft's schema) writes a valid DSL every time
    — valid, and meaningless: no code follows from it."""
    from horizonrl.engine.hf import HFEngine
    from horizonrl.roles import Roles, RolesConfig

    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, max_batch_size=4)
    roles = Roles(
        RolesConfig.model_validate({"coder": {"max_tokens": 16, "temperature": 1.0}}), engine, tokenizer
    )
    coder = roles.get("coder")

    async def main():
        try:
            themes = ("a hedge maze", "a market", "a lighthouse")
            return await asyncio.gather(*(generate_world(t, coder, tmp_path, max_repairs=0) for t in themes))
        finally:
            await engine.close()

    cands = run(main())
    assert all(c.stages.get("dsl_valid") for c in cands), [c.problems for c in cands]
    assert coder.usage.structured == 3 and coder.usage.unusable == 0
    for cand in cands:
        assert load_spec(Path(cand.path) / "world.yaml").name == cand.slug
        assert cand.reached == "dsl_valid" and "no ```python block" in cand.problems[-1]


def test_generated_worlds_never_run_in_process(tmp_path):
    root = copy_maze(tmp_path)
    (root / "generated.json").write_text("{}")
    package = open_world(str(root))
    with pytest.raises(Exception, match="runs only sandboxed"):
        InProcessRunner(package)
    env = WorldEnv(WorldOptions(world=str(root), sandbox="never"))
    task = Task(id="t", env="world", split="val", data={"world": str(root), "split": "val", "index": 0})
    with pytest.raises(ConfigError, match="runs only sandboxed"):
        run(env.reset(task))


def test_worlds_list_and_show_print_each_world_and_its_first_observation():
    from typer.testing import CliRunner

    from horizonrl.cli import app

    listed = CliRunner().invoke(app, ["worlds", "list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert [line.split()[0] for line in listed.output.strip().splitlines()] == shipped_names()
    shown = CliRunner().invoke(app, ["worlds", "show", "forage", "--skin", "inverse"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "Stepping onto poison gives reward +1" in shown.output and "[tools] move" in shown.output
    bad = CliRunner().invoke(app, ["worlds", "show", "forage", "--skin", "upside_down"])
    assert bad.exit_code == 2 and "has no skin 'upside_down'; its skins: aligned, inverse" in bad.output
