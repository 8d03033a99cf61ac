"""Chat chains: the YAML schema and its one-line refusals, and the team running in real bubblewrap
workspaces of the humaneval env. The roles here are scripted (the canonical-solution oracle, and a
misbehaving script): they prove the plumbing (tools, permissions, workspace reads and writes, the
test-to-fix loop, per-role trajectories, the chain state failure analysis reads), never a result."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from horizonrl.analysis.detectors import detect
from horizonrl.analysis.trace import load_traces
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.humaneval import problems
from horizonrl.envs.humaneval.env import HumanEvalEnv, HumanEvalOptions
from horizonrl.errors import ConfigError
from horizonrl.io import write_jsonl_atomic
from horizonrl.multiagent.chain import ChainPhase, load_chain, parse_chain
from horizonrl.multiagent.team import TeamRunner
from horizonrl.multiagent.team_oracle import TeamOracle
from horizonrl.sandbox import SandboxConfig
from horizonrl.sandbox.bwrap import BwrapOptions
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Message, Task, write_trajectories

if shutil.which("bwrap") is None:  # never silently: the reason is printed with -ra
    pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it", allow_module_level=True)
try:
    problems.shipped_problems()
except ConfigError as exc:
    pytest.skip(f"{exc} (make setup installs it)", allow_module_level=True)

ROLES = {"lead": {"system": "You lead."}, "coder": {"system": "You code.", "tools": ["write_file"]}}
PHASE = {"name": "code", "instructor": "lead", "assistant": "coder", "max_turns": 2}


def _chain(**changes: object) -> dict:
    return {"name": "t", "roles": ROLES, "phases": [PHASE]} | changes


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            _chain(phases=[PHASE | {"assistant": "tester"}]),
            "phase 'code' names missing role 'tester'; roles: lead",
        ),
        (
            _chain(phases=[PHASE | {"max_turns": None}]),
            "phase 'code' is a cycle (lead <-> coder) with no cap",
        ),
        (
            _chain(check="write_file", phases=[{"loop": "fix", "phases": [PHASE]}]),
            "loop 'fix' is a cycle with no cap; set its max_cycles",
        ),
        (
            _chain(phases=[PHASE | {"tools": {"lead": ["write_file"]}}]),
            "gives role 'lead' tool 'write_file', which the role may not use (its tools: none)",
        ),
        (
            _chain(phases=[PHASE | {"writes": ["../../etc/passwd"]}]),
            "'../../etc/passwd' leaves the workspace",
        ),
        (_chain(phases=[PHASE | {"reads": ["/etc/passwd"]}]), "'/etc/passwd' leaves the workspace"),
        (_chain(phases=[PHASE | {"sees": ["review"]}]), "sees 'review', which is not an earlier phase"),
        (_chain(colour="red"), "unknown key 'colour'"),
    ],
)
def test_bad_chains_are_refused_in_one_line_naming_the_fault(data: dict, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_chain(data, "chain.yaml")
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_bad_chain_file_stops_horizon_eval_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "chain.yaml"
    bad.write_text("name: t\nroles: {a: {system: x}}\nphases:\n  - {name: p, instructor: a, assistant: b}\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "horizonrl.cli",
            "eval",
            "configs/humaneval_team.yaml",
            f"multiagent.chain={bad}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert "names missing role 'b'" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def _runner(tmp_path: Path, script: object, chain_name: str = "software_company") -> TeamRunner:
    from horizonrl.models import tiny_random_model

    _, tokenizer = tiny_random_model()
    bwrap = BwrapOptions(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"))
    options = HumanEvalOptions(sandbox=SandboxConfig(bwrap=bwrap), command_timeout_s=1, eval_timeout_s=1)
    chain = load_chain(chain_name)
    return TeamRunner(
        chain,
        None,  # type: ignore[arg-type]  # scripted: no policy samples
        tokenizer,
        None,
        SamplingParams(max_new_tokens=384, seed=0),
        lambda: HumanEvalEnv(options),
        "humaneval",
        4096,
        script or TeamOracle(chain),  # type: ignore[arg-type]
    )


def _task(number: int) -> Task:
    return next(t for t in problems.shipped_tasks("all") if t.id == f"HumanEval-{number}")


@pytest.fixture(scope="module")
def oracle_episode(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The canonical-solution script's episode on HumanEval-0."""
    return asyncio.run(_runner(tmp_path_factory.mktemp("oracle"), None).run(_task(0), "ep0"))


@pytest.fixture(scope="module")
def misbehaving_episode(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The rule-breaking team's episode on HumanEval-0 (:class:`Misbehaving`)."""
    return asyncio.run(_runner(tmp_path_factory.mktemp("misbehaving"), Misbehaving()).run(_task(0), "ep1"))


def test_the_oracle_team_solves_with_every_role_recorded_and_a_clean_trace(
    oracle_episode: tuple, tmp_path: Path
) -> None:
    record, trajectories = oracle_episode
    assert record.reward == 1.0 and record.error is None
    facts = record.chain
    assert [(p.name, p.ended) for p in facts.phases] == [
        ("design", "turn_cap"),
        ("coding", "consensus"),
        ("code_review", "consensus"),
    ]
    assert [(c.phase, c.passed) for c in facts.checks] == [("test_and_fix", True), ("final", True)]
    assert "def has_close_elements" in facts.final_code
    assert facts.permissions["code_review"] == {"reviewer": ["run_examples"], "programmer": ["write_file"]}
    assert {t.role for t in trajectories} == {"ceo", "cto", "programmer", "reviewer"}
    for t in trajectories:  # the role's own tokens trained, everything else masked
        assert t.episode_id == "ep0" and t.id.startswith("ep0/") and t.reward == 1.0
        assert len(t.response_ids) == len(t.loss_mask) and 0 < sum(t.loss_mask) < len(t.loss_mask)
    coder = next(t for t in trajectories if t.id == "ep0/coding/programmer")
    assert [m.role for m in coder.messages] == ["system", "user", "user", "assistant", "tool", "assistant"]
    assert coder.messages[3].tool_calls[0].name == "write_file"
    # what `horizon analyze` reads: the chain state beside the trajectories, the steps in order
    write_jsonl_atomic(tmp_path / "run" / "episodes.jsonl", [record])
    write_trajectories(tmp_path / "run" / "trajectories.jsonl", trajectories)
    (trace,) = load_traces(tmp_path / "run").traces
    assert trace.chain is not None and len(trace.steps) == len(record.order)
    assert [s.role for s in trace.steps] == record.order
    assert trace.steps[3].phase == "coding" and trace.steps[3].tool_calls[0][0] == "write_file"
    assert [m for m, v in detect(trace).items() if v.present] == []


class Misbehaving:
    """A team that breaks the rules: the reviewer writes the code itself (refused: its phase gives it
    run_examples only), the programmer answers in a ```python block (written, ChatDev style) with code
    that hangs, and nobody ever agrees."""

    def act(self, role: str, phase: ChainPhase, task: Task, messages: list[Message]) -> str:
        if role == "programmer" and phase.name == "coding":
            return (
                "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
            )
        if role == "reviewer" and messages[-1].role != "tool":
            return format_tool_call("write_file", {"path": "solution.py", "content": "x = 1\n"})
        if role == "tester":
            assert "Test report" in messages[1].content and "timed out" in messages[1].content
        return "I am not sure."


def test_refused_calls_code_blocks_hanging_code_and_the_fix_loop(misbehaving_episode: tuple) -> None:
    record, trajectories = misbehaving_episode
    assert record.reward == 0.0 and record.error is None
    facts = record.chain
    assert "while True" in facts.final_code  # the code block was written; the refused write was not
    reviewer = next(t for t in trajectories if t.id == "ep1/code_review/reviewer")
    refusal = next(m.content for m in reviewer.messages if m.role == "tool")
    assert refusal.startswith("Error: role 'reviewer' may not call write_file in phase 'code_review'")
    # the hanging code is stopped in the sandbox; each failing check starts a test-and-fix cycle
    assert [(c.phase, c.passed) for c in facts.checks] == [
        ("test_and_fix", False),
        ("test_and_fix", False),
        ("final", False),
    ]
    assert "[timed out]" in facts.checks[0].output
    assert [(p.name, p.cycle, p.ended) for p in facts.phases][-2:] == [
        ("testing", 1, "turn_cap"),
        ("testing", 2, "turn_cap"),
    ]
    assert {t.id for t in trajectories} >= {"ep1/testing.1/tester", "ep1/testing.2/programmer"}


def test_team_sft_trains_one_adapter_per_acting_role_and_the_team_plays_them(tmp_path: Path) -> None:
    """`horizon team sft` then `horizon eval` with the adapters, on the tiny random model (the
    plumbing: demonstrations, one adapter per role that acted, the team sampling from them)."""
    import json

    import yaml
    from typer.testing import CliRunner

    from horizonrl.cli import app
    from horizonrl.multiagent.chain import SHIPPED

    assert "software_company" in SHIPPED
    source = Path("src/horizonrl/multiagent/chains/software_company.yaml")
    chain = yaml.safe_load(source.read_text())
    for role in chain["roles"].values():  # a chain file of the user's: short steps for the random model
        role["max_new_tokens"] = 8
    (tmp_path / "chain.yaml").write_text(yaml.safe_dump(chain))
    common = [
        "configs/humaneval_team.yaml",
        "model.path=tiny-random",
        f"output_dir={tmp_path}",
        f"multiagent.chain={tmp_path / 'chain.yaml'}",
    ]
    trained = CliRunner().invoke(app, ["team", "sft", *common, "sft.num_demos=1", "sft.batch_size=4"])
    assert trained.exit_code == 0, trained.output
    team = tmp_path / "humaneval_team" / "team"
    summary = json.loads((team / "sft_summary.json").read_text())
    assert summary["solved_by_script"] == 1 and set(summary["roles"]) == {
        "ceo",
        "cto",
        "programmer",
        "reviewer",
    }
    assert summary["roles"]["cto"]["demos"] == 2  # the CTO answers in design and instructs in coding
    adapters = [f"multiagent.adapters.{role}={team / 'adapters' / role}" for role in summary["roles"]]
    assert f"evaluate: horizon eval configs/humaneval_team.yaml {' '.join(adapters)}" in " ".join(
        trained.output.split()
    )
    played = CliRunner().invoke(app, ["eval", *common, *adapters, "eval.num_tasks=1"])
    assert played.exit_code == 0, played.output
    result = json.loads((tmp_path / "humaneval_team" / "chain_eval" / "summary.json").read_text())
    assert result["adapters"]["programmer"].endswith("adapters/programmer") and result["episodes"] == 1
    scripted = CliRunner().invoke(app, ["eval", *common, "eval.num_tasks=2", "--policy", "oracle"])
    assert scripted.exit_code == 0, scripted.output
    result = json.loads((tmp_path / "humaneval_team" / "chain_eval" / "summary.json").read_text())
    assert (
        result["policy"] == "oracle" and result["solved_episodes"] == 2 and result["final_check_passed"] == 2
    )


def test_team_credit_charges_each_role_only_its_own_failures(
    oracle_episode: tuple, misbehaving_episode: tuple
) -> None:
    """One problem's group: the oracle team's episode and the misbehaving one (whose reviewer writes
    code, a 1.2 the detectors charge to the reviewer). Every role shares the outcome; only the
    reviewer also pays the penalty, so its advantage is the larger one."""
    from horizonrl.multiagent.team_credit import blamed_modes, team_batches

    good, bad = oracle_episode, misbehaving_episode
    assert blamed_modes(bad, ["1.2"]) == {
        r: ["1.2"] if r == "reviewer" else [] for r in blamed_modes(bad, [])
    }
    batches = team_batches([[good, bad]], {"1.2": 0.5}, "grpo", norm_by_std=False)
    assert batches["reviewer"].rewards == [1.0, -0.5] and batches["reviewer"].blamed == {"1.2": 1}
    assert batches["cto"].rewards == [1.0, 0.0] and batches["cto"].blamed == {}
    assert batches["reviewer"].advantages == pytest.approx([0.75, -0.75])
    # every trajectory a role wrote in an episode carries its advantage: the CTO acts in two phases
    assert dict(zip((t.id for t in batches["cto"].trajectories), batches["cto"].advantages, strict=True)) == {
        "ep0/design/cto": 0.5,
        "ep0/coding/cto": 0.5,
        "ep1/design/cto": -0.5,
        "ep1/coding/cto": -0.5,
    }
    assert batches["tester"].advantages == [0.0, 0.0]  # acted in one episode only: a group of one


def test_team_rl_updates_the_roles_with_signal_and_plays_their_adapters(tmp_path: Path) -> None:
    """`horizon team rl` on the tiny random model: two steps of two episodes; the roles whose episodes
    differ in their penalties are updated, written and sampled from in the next step."""
    import json

    import yaml
    from typer.testing import CliRunner

    from horizonrl.cli import app

    chain = yaml.safe_load(Path("src/horizonrl/multiagent/chains/software_company.yaml").read_text())
    for role in chain["roles"].values():
        role["max_new_tokens"] = 40
    (tmp_path / "chain.yaml").write_text(yaml.safe_dump(chain))
    penalties = json.dumps({m: 0.1 for m in ("1.1", "1.3", "1.5", "2.3", "2.5", "3.2")})
    common = [
        "configs/humaneval_team.yaml",
        "model.path=tiny-random",
        f"output_dir={tmp_path}",
        f"multiagent.chain={tmp_path / 'chain.yaml'}",
        "train.tasks_per_step=1",
        "train.group_size=2",
    ]
    refused = CliRunner().invoke(app, ["team", "rl", *common, "train.advantage=reinforce_pp"])
    assert refused.exit_code == 2 and "train.advantage must be one of grpo, rloo" in refused.output
    ran = CliRunner().invoke(
        app, ["team", "rl", *common, "train.steps=2", f"train.failure_penalties={penalties}"]
    )
    assert ran.exit_code == 0, ran.output
    team = tmp_path / "humaneval_team" / "team"
    summary = json.loads((team / "rl_summary.json").read_text())
    first, _ = summary["steps"]
    updated = sorted(role for role, info in first["roles"].items() if info["with_signal"])
    assert updated, first  # the penalties differ between the two episodes for some role
    for role in updated:
        assert (
            "pg_loss" in first["roles"][role]
            and (team / "rl_adapters" / role / "horizonrl_policy.json").is_file()
        )
    records = [json.loads(line) for line in (team / "rl_episodes.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert all(records[k]["adapters"][role] == role for k in (2, 3) for role in updated)
    assert all(records[0]["adapters"][role] is None for role in updated)  # step 1: the base
    assert "evaluate: horizon eval configs/humaneval_team.yaml multiagent.adapters." in " ".join(
        ran.output.split()
    )
