"""SWE tasks end to end on a tiny local package built into a dataset by the real task factory:
validation, the evaluation harness (gold resolves, empty does not, bad input is reported), the swe
env with its oracle through the rollout pipeline, pass-rate filtering, and the shipped dataset."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.swe.bugs.factory import BuildConfig, _Package, build_dataset, fetch_source
from horizonrl.envs.swe.bugs.mutations import Mutation
from horizonrl.envs.swe.env import SWEEnv, SWEOptions, fix_edits
from horizonrl.envs.swe.evaluate import SWERuntime
from horizonrl.envs.swe.harness import Prediction, evaluate_predictions, read_predictions, summarize
from horizonrl.envs.swe.instances import Dataset, read_instances
from horizonrl.rollout.base import RolloutLimits, make_jobs
from horizonrl.rollout.pass_rate import filter_by_pass_rate
from horizonrl.rollout.pipeline import run_pipeline
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Task

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it", allow_module_level=True)

MINI = {
    "mini/__init__.py": '''"""A tiny package the factory has never seen."""


def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def total(items):
    result = 0
    for item in items:
        result += item
    return result


def initials(name):
    parts = name.split()
    return "".join(part[0].upper() for part in parts if part)
''',
    "tests/test_mini.py": """from mini import clamp, initials, total


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_total():
    assert total([1, 2, 3]) == 6


def test_total_empty():
    assert total([]) == 0


def test_initials():
    assert initials("ada  lovelace") == "AL"
""",
}


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    tmp = tmp_path_factory.mktemp("swe")
    package = write_package(tmp / "mini", MINI)
    config = BuildConfig(
        sources=[str(package)], out=tmp / "dataset", per_package=6, max_candidates=20, workers=2
    )
    reports = asyncio.run(build_dataset(config))
    assert reports[0].error is None and reports[0].accepted >= 3, reports
    (tmp / "dataset" / "splits.json").write_text(json.dumps({"train": ["mini"], "test": []}))
    return Dataset(tmp / "dataset")


def test_factory_validates_instances_of_a_package_it_has_never_seen(dataset: Dataset) -> None:
    instances = list(dataset.instances.values())
    for inst in instances:
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS
        assert not set(inst.FAIL_TO_PASS) & set(inst.PASS_TO_PASS)
        assert inst.patch.startswith("diff --git a/mini/__init__.py b/mini/__init__.py")
        assert "Failing tests:" in inst.problem_statement and inst.FAIL_TO_PASS[0] in inst.problem_statement
        removed = [
            line[1:]
            for line in inst.patch.splitlines()
            if line.startswith("-") and not line.startswith("---")
        ]
        assert not any(line.strip() and line in inst.problem_statement for line in removed)  # never the fix
    report = json.loads((dataset.root / "build" / "report.json").read_text())[0]
    assert report["tried"] >= len(instances) and report["baseline_tests"] == 6


def test_the_build_is_deterministic_and_resumes(dataset: Dataset, tmp_path: Path) -> None:
    package = write_package(tmp_path / "mini", MINI)
    config = BuildConfig(
        sources=[str(package)], out=tmp_path / "again", per_package=6, max_candidates=20, workers=2
    )
    asyncio.run(build_dataset(config))
    again = {i.instance_id: i.patch for i in read_instances(tmp_path / "again" / "instances.jsonl.gz")}
    assert again == {i.instance_id: i.patch for i in dataset.instances.values()}
    log = tmp_path / "again" / "build" / "mini.jsonl"
    tried = len(log.read_text().splitlines())
    asyncio.run(build_dataset(config))  # resumed: every candidate is known, none runs again
    assert len(log.read_text().splitlines()) == tried


def test_a_package_failing_at_baseline_is_a_recorded_rejection(tmp_path: Path) -> None:
    broken = dict(MINI, **{"tests/test_mini.py": "def test_broken():\n    assert False\n"})
    package = write_package(tmp_path / "broken", broken)
    reports = asyncio.run(build_dataset(BuildConfig(sources=[str(package)], out=tmp_path / "out", workers=1)))
    assert reports[0].error is not None and "no test passes at baseline" in reports[0].error


async def test_a_bug_that_hangs_the_tests_is_rejected_as_timeout(dataset: Dataset, tmp_path: Path) -> None:
    from horizonrl.envs.swe.testbed import ensure_test_venv, sandbox_binds
    from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions

    archive = fetch_source(str(write_package(tmp_path / "mini", MINI)), tmp_path / "packages")
    config = BuildConfig(sources=[], out=tmp_path / "out", min_timeout_s=2.0, timeout_factor=2.0)
    venv = ensure_test_venv()
    backend = BwrapBackend(BwrapOptions(state_dir=str(tmp_path / "state"), ro_binds=sandbox_binds(venv)))
    try:
        package = _Package(config, archive, backend, venv, [])
        base = await package.baseline()
        original = MINI["mini/__init__.py"]
        hang = Mutation(
            "invert_condition",
            "mini/__init__.py",
            5,
            "clamp",
            original,
            original.replace(
                "    if value < low:", "    while value < high + 1:\n        pass\n    if value < low:"
            ),
            "hang",
        )
        outcome = await package.validate(0, hang, base, timeout=2.0)
    finally:
        await backend.aclose()
    assert not outcome.accepted and outcome.reason == "timeout"


async def test_harness_gold_resolves_empty_does_not_and_bad_input_is_reported(
    dataset: Dataset, tmp_path: Path
) -> None:
    instances = list(dataset.instances.values())[:3]
    lines = [
        Prediction(
            instance_id=i.instance_id, model_name_or_path="gold", model_patch=i.patch
        ).model_dump_json()
        for i in instances
    ]
    lines.append(Prediction(instance_id=instances[0].instance_id, model_patch="").model_dump_json())
    lines.append(
        Prediction(
            instance_id=instances[1].instance_id,
            model_patch="diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
        ).model_dump_json()
    )
    lines.append(Prediction(instance_id="nope__0-0001", model_patch="").model_dump_json())
    lines.append('{"instance_id": "cut')
    path = tmp_path / "preds.jsonl"
    path.write_text("\n".join(lines) + "\n")
    predictions, bad = read_predictions(path)
    assert len(predictions) == 6 and len(bad) == 1 and ":7:" in (bad[0].error or "")
    reports = bad + await evaluate_predictions(dataset, predictions, workers=2)
    statuses = [r.status for r in reports]
    assert statuses == ["error", "resolved", "resolved", "resolved", "unresolved", "apply_failed", "error"]
    assert "unknown instance" in (reports[-1].error or "")
    gold = reports[1]
    assert all(gold.fail_to_pass.values()) and not gold.pass_to_pass_failed and gold.apply == "git apply"
    summary = summarize(reports)
    assert summary["resolved"] == 3 and summary["apply_failed"] == 1 and summary["error"] == 2


async def test_a_patch_that_edits_the_tests_does_not_pass(dataset: Dataset) -> None:
    instance = next(iter(dataset.instances.values()))
    cheat = (
        "diff --git a/tests/test_mini.py b/tests/test_mini.py\n"
        "--- a/tests/test_mini.py\n+++ b/tests/test_mini.py\n"
        "@@ -1,1 +1,4 @@\n from mini import clamp, initials, total\n"
        "+import pytest\n+\n+pytestmark = pytest.mark.skip\n"
    )
    runtime = SWERuntime(dataset)
    try:
        report = await runtime.evaluate(instance, cheat)
    finally:
        await runtime.aclose()
    assert report.apply is not None and report.status == "unresolved"  # applied, yet undone for the tests


async def test_the_oracle_fixes_every_instance_through_the_env_and_pipeline(
    dataset: Dataset, tokenizer
) -> None:
    options = SWEOptions(dataset=str(dataset.root))
    tasks = SWEEnv.make_tasks("train", 100, 0, options)
    assert {t.id for t in tasks} == set(dataset.instances)
    agent = Agent(
        tokenizer,
        None,
        SamplingParams(max_new_tokens=64),
        AgentConfig(max_turns=6, max_total_tokens=16000),
        context_length=32768,
    )
    result = await run_pipeline(
        agent, lambda: SWEEnv(options), make_jobs(tasks, 1, policy=SWEEnv.oracle()), RolloutLimits.uniform(4)
    )
    for traj in result:
        assert traj.finish == "finished" and traj.reward == 1.0, (traj.task_id, traj.error)
        assert traj.metrics["swe/resolved"] == 1.0 and traj.metrics["swe/apply:git apply"] == 1.0
        assert any(k.startswith("swe/test:") for k in traj.metrics)
        assert any(m.name == "str_replace_editor" for m in traj.messages if m.role == "tool")


async def test_doing_nothing_gets_no_reward_and_the_tools_work(
    dataset: Dataset, tokenizer, scripted_engine
) -> None:
    options = SWEOptions(dataset=str(dataset.root))
    task = SWEEnv.make_tasks("train", 1, 0, options)[0]
    engine = scripted_engine(
        [
            format_tool_call("execute_bash", {"command": "python -m pytest -q 2>&1 | tail -1"}),
            format_tool_call(
                "str_replace_editor", {"command": "view", "path": "mini/__init__.py", "view_range": [1, 3]}
            ),
            format_tool_call("finish", {}),
        ]
    )
    agent = Agent(
        tokenizer,
        engine,
        SamplingParams(max_new_tokens=128),
        AgentConfig(max_turns=6, max_total_tokens=16000),
        context_length=32768,
    )
    result = await run_pipeline(
        agent, lambda: SWEEnv(options), make_jobs([task], 1), RolloutLimits.uniform(1)
    )
    traj = result[0]
    assert traj.finish == "finished" and traj.reward == 0.0 and traj.metrics["swe/resolved"] == 0.0
    tool_outputs = [m.content for m in traj.messages if m.role == "tool"]
    assert "failed" in tool_outputs[0] and "passed" in tool_outputs[0]  # the bug is there; pytest runs
    assert '"""A tiny package' in tool_outputs[1] and "     1\t" in tool_outputs[1]


def test_fix_edits_are_the_hunks_of_the_patch() -> None:
    patch = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n d\n"
    assert fix_edits(patch) == [("m.py", "a\nb\nd\n", "a\nc\nd\n")]


def test_filter_by_pass_rate_keeps_tasks_in_range() -> None:
    from horizonrl.types import Trajectory

    def traj(task: str, reward: float) -> Trajectory:
        return Trajectory(
            id=f"{task}-{reward}-{id(object())}",
            task_id=task,
            group_id=task,
            env="x",
            messages=[],
            prompt_ids=[1],
            reward=reward,
            finish="finished",
        )

    tasks = [Task(id=name, env="x", split="train", data={}) for name in ("always", "never", "sometimes")]
    trajs = (
        [traj("always", 1.0)] * 4 + [traj("never", 0.0)] * 4 + [traj("sometimes", r) for r in (1, 0, 0, 1)]
    )
    kept, rates = filter_by_pass_rate(tasks, trajs, 0.1, 0.9)
    assert [t.id for t in kept] == ["sometimes"] and rates == {"always": 1.0, "never": 0.0, "sometimes": 0.5}


def test_the_shipped_dataset() -> None:
    data = Dataset.shipped()
    assert len(data.instances) >= 300
    train, test = {i.repo for i in data.split("train")}, {i.repo for i in data.split("test")}
    assert len(train | test) >= 5 and not train & test
    for inst in data.instances.values():
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS and inst.patch.startswith("diff --git")
        assert (data.root / "packages" / inst.snapshot).exists()
    assert (data.root / "datasheet.md").exists()


async def test_gold_resolves_and_empty_does_not_on_one_shipped_instance_per_package() -> None:
    data = Dataset.shipped()
    first: dict[str, str] = {}
    for inst in sorted(data.instances.values(), key=lambda i: i.instance_id):
        first.setdefault(inst.repo, inst.instance_id)
    gold = [Prediction(instance_id=i, model_patch=data.get(i).patch) for i in first.values()]
    empty = [Prediction(instance_id=i, model_patch="") for i in list(first.values())[:3]]
    reports = await evaluate_predictions(data, gold + empty, workers=2)
    assert [r.status for r in reports[: len(gold)]] == ["resolved"] * len(gold), [r.error for r in reports]
    assert [r.status for r in reports[len(gold) :]] == ["unresolved"] * len(empty)


def test_cli_swe_eval_gold_and_a_bad_predictions_file(dataset: Dataset, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from horizonrl.cli import app

    runner = CliRunner()
    out = tmp_path / "report.jsonl"
    result = runner.invoke(app, ["swe", "eval", "--gold", "--dataset", str(dataset.root), "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["resolved"] == summary["instances"] == len(dataset.instances)
    missing = runner.invoke(
        app, ["swe", "eval", str(tmp_path / "nope.jsonl"), "--dataset", str(dataset.root)]
    )
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_cli_tasks_filter_keeps_tasks_by_pass_rate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from horizonrl.cli import app

    out = tmp_path / "kept.jsonl"
    args = [
        "tasks",
        "filter",
        "configs/shell.yaml",
        "--k",
        "2",
        "--n",
        "3",
        "--min-rate",
        "0",
        "--max-rate",
        "1",
    ]
    args += ["--out", str(out), "model.path=tiny-random", "sampling.max_new_tokens=16", "agent.max_turns=1"]
    args += ["sft.enabled=false", f"output_dir={tmp_path}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    kept = [Task.model_validate_json(line) for line in out.read_text().splitlines()]
    rates = json.loads(out.with_suffix(".rates.json").read_text())
    assert len(kept) == 3 and set(rates) == {t.id for t in kept} and all(r == 0.0 for r in rates.values())
    narrow = CliRunner().invoke(app, [a if a != "0" else "0.5" for a in args])  # --min-rate 0.5
    assert narrow.exit_code == 0 and "kept 0 of 3" in narrow.output


def test_cli_swe_eval_reports_a_bad_line_once_counts_it_and_says_why_a_patch_did_not_apply(
    dataset: Dataset, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from horizonrl.cli import app

    first = next(iter(dataset.instances.values()))
    bogus = "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n"
    preds = tmp_path / "preds.jsonl"
    lines = [Prediction(instance_id=first.instance_id, model_patch=p).model_dump_json() for p in ("", bogus)]
    preds.write_text("\n".join([*lines, "not json"]) + "\n")
    out = tmp_path / "report.jsonl"
    result = CliRunner().invoke(
        app, ["swe", "eval", str(preds), "--dataset", str(dataset.root), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.output.count(f"{preds}:3:") == 1  # the bad line, printed once
    assert "3/3" in result.output  # the progress total counts the bad line
    failed = [json.loads(line) for line in out.read_text().splitlines()][2]  # bad lines come first
    assert failed["status"] == "apply_failed" and failed["error"].startswith("git apply: error:")
    assert "nope.py" in failed["error"] and "\n" not in failed["error"]


def test_cli_swe_eval_exit_codes(dataset: Dataset, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from horizonrl.cli import app

    def run(text: str) -> tuple[int, str]:
        preds = tmp_path / "preds.jsonl"
        preds.write_text(text)
        args = ["swe", "eval", str(preds), "--dataset", str(dataset.root), "--out", str(tmp_path / "r.jsonl")]
        result = CliRunner().invoke(app, args)
        return result.exit_code, result.output

    code, output = run("\n")
    assert code == 2 and "is empty" in output  # bad input: nothing to evaluate
    code, output = run("[1]\n{}\n")
    assert code == 2 and "no valid prediction" in output  # every line malformed
    unknown = Prediction(instance_id="nope__0-0001", model_patch="").model_dump_json()
    code, output = run(unknown + "\n" + unknown + "\n")
    assert code == 1 and "every instance ended in error" in output  # all errored
