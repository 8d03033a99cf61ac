"""Failure analysis: the taxonomy, annotator reply parsing and window merging, the detectors on
constructed traces, Cohen's κ by hand, and `horizon analyze` on files (bad lines, bad labels)."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from horizonrl.analysis.agreement import agreement, cohen_kappa, read_labels
from horizonrl.analysis.annotator import (
    annotate,
    merge,
    parse_reply,
    prompt,
    structured_verdicts,
    verdicts_model,
    windows,
)
from horizonrl.analysis.detectors import detect
from horizonrl.analysis.mast import CATEGORIES, MODE_IDS, MODES
from horizonrl.analysis.trace import Step, Trace, load_traces
from horizonrl.cli import app
from horizonrl.engine.hf import HFEngine
from horizonrl.errors import DataError
from horizonrl.roles import Roles, RolesConfig
from horizonrl.roles.structured import parse_reply as parse_structured
from horizonrl.types import Message, ToolCall, Trajectory


def test_the_taxonomy_has_14_modes_in_3_categories():
    assert len(MODES) == 14 and set(CATEGORIES) == {"FC1", "FC2", "FC3"}
    assert [m.id for m in MODES if m.category == "FC3"] == ["3.1", "3.2", "3.3"]
    assert len({m.definition for m in MODES}) == 14


# ---------------------------------------------------------------------------------------------------
# annotator replies


def test_a_well_formed_reply():
    reply = "\n".join(
        [f"{m}: no" for m in MODE_IDS if m not in ("1.3", "3.2")]
        + [
            "1.3: yes | steps 2, 4 | role solver | reason the same call twice",
            "3.2: yes | steps 5 | role verifier | reason it only restates the answer",
        ]
    )
    parsed = parse_reply(reply, set(range(10)))
    assert parsed.unparsed == 0 and set(parsed.verdicts) == set(MODE_IDS)
    v = parsed.verdicts["1.3"]
    assert v.present and v.steps == [2, 4] and v.role == "solver" and v.reason == "the same call twice"
    assert parsed.verdicts["3.2"].steps == [5] and not parsed.verdicts["1.1"].present


def test_partial_and_garbled_replies_are_counted_not_raised():
    reply = (
        "Here is my analysis.\n"
        "1.3 - Yes (step 3): repeated\n"
        "2.7: yes | steps 1\n"  # a code the taxonomy does not have
        "1.6: no\n"
        "3.3: maybe\n"  # no yes/no
        "FC2 looks fine overall\n"
    )
    parsed = parse_reply(reply, set(range(5)))
    assert set(parsed.verdicts) == {"1.3"} and parsed.verdicts["1.3"].steps == [3]
    assert parsed.unparsed == 3
    assert parse_reply("").verdicts == {} and parse_reply("\x00\x01 ###").unparsed == 0


def test_a_json_reply_and_steps_outside_the_window():
    found = {"present": "yes", "steps": [7, 30], "role": "agent", "reason": "never finished"}
    reply = json.dumps({"1.5": found, "9.9": True})
    parsed = parse_reply(reply, set(range(5, 10)))
    assert parsed.verdicts["1.5"].present and parsed.verdicts["1.5"].steps == [7]
    assert parsed.unparsed == 1


def test_a_cut_off_json_reply_keeps_its_complete_verdicts():
    found = '{"present": true, "steps": [2], "role": "agent", "reason": "x"}'
    reply = '{"1.1": {"present": false}, "1.3": ' + found + ', "1.4": {"pres'
    parsed = parse_reply(reply, set(range(5)))
    assert set(parsed.verdicts) == {"1.1", "1.3"} and parsed.verdicts["1.3"].steps == [2]
    # a JSON verdict read line by line: "present": false is a no, not the word "present"
    parsed = parse_reply('"1.1": {"present": false,\n"1.2": {"present": true, "steps": [1]', set(range(5)))
    assert not parsed.verdicts["1.1"].present and parsed.verdicts["1.2"].present


def test_the_structured_reply_answers_every_mode_within_the_window():
    model = verdicts_model(4, 8, ("solver", "verifier"))
    absent = {m: {"present": False} for m in MODE_IDS}
    found = {"present": True, "steps": [5, 4, 5], "role": "verifier", "reason": "only restates it"}
    reply = parse_structured(json.dumps(absent | {"3.2": found}), model)
    parsed = structured_verdicts(reply.value)
    assert set(parsed.verdicts) == set(MODE_IDS) and parsed.unparsed == 0
    v = parsed.verdicts["3.2"]
    assert v.present and v.steps == [4, 5] and v.role == "verifier" and v.reason == "only restates it"
    for wrong in (
        absent | {"3.2": found | {"steps": [9]}},  # a step the window does not show
        absent | {"3.2": found | {"role": "judge"}},  # a role the trace does not have
        {m: v for m, v in absent.items() if m != "2.4"},  # a mode left out
        absent | {"9.9": {"present": False}},  # a mode the taxonomy does not have
        absent | {"1.1": {"present": True}},  # found, but where?
    ):
        assert not parse_structured(json.dumps(wrong), model).ok


def test_windows_overlap_and_cover_every_step():
    assert windows(5, 12, 2) == [(0, 5)]
    assert windows(25, 10, 2) == [(0, 10), (8, 18), (16, 25)]
    with pytest.raises(ValueError):
        windows(5, 4, 4)


def test_merging_keeps_a_mode_found_in_any_window_with_its_steps():
    first = parse_reply("1.3: no\n2.3: yes | steps 3 | reason drifts", set(range(0, 10)))
    second = parse_reply(
        "1.3: yes | steps 17 | role agent | reason loops\n2.3: yes | steps 9", set(range(8, 18))
    )
    merged = merge([first, second])
    assert merged["1.3"].present and merged["1.3"].steps == [17]
    assert merged["2.3"].steps == [3, 9] and merged["2.3"].reason == "drifts"


class _WindowedClient:
    """Stands in for the annotator model: answers 1.3 'yes' only in the window that shows step 14,
    as free text (``json=False``: an endpoint that cannot enforce the structure) or as the structured
    object."""

    def __init__(self, json: bool = False) -> None:
        self.prompts: list[str] = []
        self.json = json

    async def chat(self, messages, **sampling):
        text = messages[-1].content
        self.prompts.append(text)
        if self.json:
            found = {"present": True, "steps": [14], "role": "agent", "reason": "repeats"}
            verdicts = {m: {"present": False} for m in MODE_IDS}
            return json.dumps(verdicts | ({"1.3": found} if "[step 14 " in text else {}))
        return "1.3: yes | steps 14 | role agent | reason repeats" if "[step 14 " in text else "1.3: no"

    async def structured(self, messages, schema, **sampling):
        return parse_structured(await self.chat(messages, **sampling), schema)


@pytest.mark.parametrize("structured", [True, False])
async def test_a_long_trace_is_annotated_in_windows_with_global_step_indices(structured):
    trace = _trace([Step(i, "agent", f"thinking {i}") for i in range(20)])
    client = _WindowedClient(json=structured)
    annotation = await annotate(trace, client, window_steps=8, overlap=2)
    assert annotation.windows == 3 and len(client.prompts) == 3
    assert annotation.verdicts["1.3"].present and annotation.verdicts["1.3"].steps == [14]
    if structured:
        assert annotation.unusable == 0 and annotation.unanswered == []
    else:  # read from the text: only the modes it names are answered
        assert annotation.unusable == 3 and "1.1" in annotation.unanswered
    assert "[step 0 · agent]" in client.prompts[0] and "[step 19 · agent]" in client.prompts[-1]
    assert "1.1 disobey task specification" in prompt(trace, 0, 8)[0].content


async def test_a_real_engine_annotator_answers_every_mode_in_every_window(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer)
    roles = Roles(RolesConfig(), engine, tokenizer)
    client = roles.get("annotator")
    traces = [  # 2 windows (steps 0-1, 1-2), and 1 window of two roles: 3 replies, batched
        _trace([Step(i, "agent", f"calling calculator {i}") for i in range(3)]),
        _trace([Step(0, "solver", "x = 5"), Step(1, "verifier", "looks right")]),
    ]
    annotations = await asyncio.gather(*(annotate(t, client, window_steps=2, overlap=1) for t in traces))
    assert [a.windows for a in annotations] == [2, 1]
    for trace, annotation in zip(traces, annotations, strict=True):
        assert annotation.unusable == 0 and annotation.unanswered == []
        for verdict in annotation.verdicts.values():
            assert set(verdict.steps) <= {s.index for s in trace.steps}
            assert verdict.role in (None, *trace.roles) and verdict.present == (verdict.role is not None)
    usage = roles.usage()["annotator"]
    assert usage["structured"] == 3 and usage["unusable"] == 0
    await engine.close()


# ---------------------------------------------------------------------------------------------------
# detectors on constructed traces


def _trace(steps, finish="finished", success=False, task="Compute 2 + 3 and report it.", roles=None) -> Trace:
    roles = roles or sorted({s.role for s in steps}) or ["agent"]
    return Trace("t", "calc", task, steps, finish, success, float(success), roles, ["t"])


def _call(i, name, args, obs="", role="agent") -> Step:
    return Step(i, role, f"calling {name}", [(name, json.dumps(args, sort_keys=True))], obs)


def test_step_repetition():
    same = [
        _call(0, "calculator", {"expression": "2+3"}, "5"),
        _call(1, "calculator", {"expression": "2+3"}, "5"),
    ]
    v = detect(_trace(same))["1.3"]
    assert v.present and v.steps == [0, 1]
    different = [_call(0, "calculator", {"expression": "2+3"}, "5"), _call(1, "finish", {"answer": "5"})]
    assert not detect(_trace(different, success=True))["1.3"].present
    assert detect(_trace(different, finish="loop"))["1.3"].present
    copied = [Step(0, "verifier", "The answer is 18."), Step(1, "refiner", "The answer is 18.")]
    assert detect(_trace(copied))["1.3"].steps == [0, 1]  # a refiner copying the review verbatim


def test_unaware_of_termination_and_malformed():
    steps = [_call(0, "calculator", {"expression": "2+3"}, "5")]
    assert detect(_trace(steps, finish="turn_budget"))["1.5"].steps == [0]
    assert not detect(_trace(steps, finish="finished"))["1.5"].present
    assert detect(_trace(steps, finish="malformed"))["1.1"].present
    assert not detect(_trace(steps))["1.1"].present


def test_premature_termination_needs_a_wrong_finish_without_verification():
    wrong = [_call(0, "calculator", {"expression": "2*3"}, "6"), _call(1, "finish", {"answer": "6"})]
    v = detect(_trace(wrong))["3.1"]
    assert v.present and v.steps == [1]
    assert not detect(_trace(wrong, success=True))["3.1"].present  # right answers are not premature
    checked = [
        *wrong[:1],
        _call(1, "calculator", {"expression": "6 / 3"}, "2"),
        _call(2, "finish", {"answer": "6"}),
    ]
    assert not detect(_trace(checked))["3.1"].present  # the answer was taken up again: a check
    reviewed = [
        Step(0, "generator", "2*3 = 6. Answer: 6"),
        Step(1, "verifier", "Correct."),
        Step(2, "refiner", "Answer: 6"),
    ]
    assert not detect(_trace(reviewed))["3.1"].present
    unreviewed = [Step(0, "planner", "Multiply."), Step(1, "solver", "Answer: 6")]
    assert detect(_trace(unreviewed))["3.1"].present


def test_conversation_reset():
    opening = "Let us start: first compute the number of boxes."
    steps = [Step(0, "planner", opening), Step(1, "solver", "12 boxes"), Step(2, "planner", opening)]
    v = detect(_trace(steps))["2.1"]
    assert v.present and v.steps == [2] and v.role == "planner"
    task = "A farm has 12 cartons of 6 eggs each. How many eggs are there?"
    restating = [Step(0, "solver", "72"), Step(1, "solver", f"Again: {task}")]
    assert detect(_trace(restating, task=task))["2.1"].present
    assert not detect(_trace([Step(0, "planner", opening), Step(1, "solver", "12")]))["2.1"].present


# ---------------------------------------------------------------------------------------------------
# agreement


def test_cohen_kappa_by_hand():
    # p_o = 4/6; p_a = p_b = 1/2 -> p_e = 1/2; kappa = (2/3 - 1/2) / (1/2) = 1/3
    assert cohen_kappa([1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 0, 1]) == pytest.approx(1 / 3)
    # p_o = 0.8; p_a = 0.4, p_b = 0.2 -> p_e = 0.08 + 0.48 = 0.56; kappa = 0.24 / 0.44
    assert cohen_kappa([1, 1, 0, 0, 0], [1, 0, 0, 0, 0]) == pytest.approx(0.24 / 0.44)
    assert cohen_kappa([0, 0, 0], [0, 0, 0]) == 1.0 and cohen_kappa([0, 0], [1, 1]) == 0.0


def test_agreement_per_mode_and_pooled():
    labels = {"a": {"1.3": 1, "3.1": 0}, "b": {"1.3": 0, "3.1": 1}, "c": {"1.3": 0, "3.1": 0}}
    predicted = {"a": {"1.3": 1}, "b": {"3.1": 1}, "c": {"1.3": 1}}
    out = agreement(labels, predicted, ["1.3", "3.1"])
    assert out["items"] == 3 and out["per_mode"]["3.1"]["accuracy"] == 1.0
    assert out["per_mode"]["1.3"]["accuracy"] == pytest.approx(2 / 3) and out["accuracy"] == pytest.approx(
        5 / 6
    )


def test_labels_for_unknown_modes_are_an_error_naming_them(tmp_path):
    path = tmp_path / "labels.jsonl"
    modes = dict.fromkeys(MODE_IDS, 0)
    path.write_text(json.dumps({"id": "x", "modes": {**modes, "2.7": 1, "1.6": 0}}) + "\n")
    with pytest.raises(DataError, match=r"unknown mode id\(s\) 1\.6, 2\.7; valid ids: 1\.1, 1\.2"):
        read_labels(path)
    path.write_text(json.dumps({"id": "x", "modes": {"1.1": 1}}) + "\n")
    with pytest.raises(DataError, match="no label for mode"):
        read_labels(path)


# ---------------------------------------------------------------------------------------------------
# horizon analyze


def _traj(tid: str, finish: str = "finished", answer: str = "6", success: bool = False) -> Trajectory:
    call = ToolCall(id="c0", name="calculator", arguments={"expression": "2*3"})
    done = ToolCall(id="c1", name="finish", arguments={"answer": answer})
    return Trajectory(
        id=tid,
        task_id=tid,
        group_id=tid,
        env="calc",
        messages=[
            Message(role="system", content="s"),
            Message(role="user", content="What is 2 + 3?"),
            Message(role="assistant", content="c", tool_calls=[call]),
            Message(role="tool", content="6", tool_call_id="c0"),
            Message(role="assistant", content="f", tool_calls=[done]),
        ],
        prompt_ids=[1],
        finish=finish,
        reward=float(success),
        metrics={"success": float(success)},
    )


def test_analyze_a_file_skips_bad_lines_and_compares_runs(tmp_path):
    before = tmp_path / "before.jsonl"
    after = tmp_path / "after.jsonl"
    before.write_text(
        _traj("a", finish="malformed").to_json() + "\n" + _traj("b", finish="malformed").to_json() + "\n"
    )
    after.write_text(
        _traj("a").to_json() + "\nnot json\n" + _traj("b", answer="5", success=True).to_json() + "\n"
    )
    assert [t.id for t in load_traces(after).traces] == ["a", "b"]
    assert load_traces(after).skipped[0].startswith(f"{after}:2: neither a trajectory")
    result = CliRunner().invoke(app, ["analyze", str(after), "--compare", str(before)])
    assert result.exit_code == 0, result.output
    assert f"skipped {after}:2: neither a trajectory" in result.output.splitlines()[0]
    data = json.loads((tmp_path / "after.mast.json").read_text())
    assert data["traces"][0]["modes"]["3.1"]["steps"] == [1]
    assert data["compare"]["change"]["1.1"] == {"before": 1.0, "after": 0.0, "change": -1.0}
    assert data["compare"]["change"]["3.1"]["change"] == 0.5
    assert (tmp_path / "after.mast.png").stat().st_size > 0


def test_analyze_bad_input_is_one_line(tmp_path):
    runner = CliRunner()
    empty = tmp_path / "run"
    empty.mkdir()
    result = runner.invoke(app, ["analyze", str(empty)])
    assert result.exit_code == 2 and "holds no trajectory files" in " ".join(result.output.split())
    garbage = tmp_path / "g.jsonl"
    garbage.write_text("nope\n")
    result = runner.invoke(app, ["analyze", str(garbage)])
    assert result.exit_code == 2 and "holds no trajectories (1 lines skipped)" in " ".join(
        result.output.split()
    )
    result = runner.invoke(app, ["analyze", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in result.output


# ---------------------------------------------------------------------------------------------------
# failures as signals


def test_penalize_subtracts_per_found_mode_and_keeps_the_outcome_apart():
    from horizonrl.analysis.signals import penalize

    wrong = _traj("w")  # finishes 6 unverified and wrong: 3.1
    right = _traj("r", answer="5", success=True)
    malformed = _traj("m", finish="malformed")
    shaped, metrics = penalize([wrong, right, malformed], {"3.1": 0.25, "1.1": 0.5})
    assert [t.reward for t in shaped] == [-0.25, 1.0, -0.5]
    assert [t.metrics["outcome_reward"] for t in shaped] == [0.0, 1.0, 0.0]
    assert [t.success for t in shaped] == [False, True, False]
    assert metrics["failure_signals/penalty_mean"] == pytest.approx(0.25)
    assert metrics["failure_signals/rate_3.1"] == pytest.approx(1 / 3)
    assert metrics["failure_signals/outcome_reward_mean"] == pytest.approx(1 / 3)


def test_failure_penalties_name_modes_a_detector_finds():
    from horizonrl.config import load_config

    with pytest.raises(DataError.__mro__[1], match=r"2\.2 that no detector finds; valid: 1\.1, 1\.2"):
        load_config("configs/calc.yaml", ["train.failure_penalties={'2.2': 0.1}"])
    config = load_config(
        "configs/calc.yaml", ["train.failure_penalties={'2.2': 0.1}", "train.failure_judge=true"]
    )
    assert config.train.failure_penalties == {"2.2": 0.1}


def test_a_run_with_failure_penalties_logs_the_penalty_apart(tmp_path):
    import toy_envs  # noqa: F401 - registers the coin env
    from builders import TINY_COIN

    from horizonrl.config import load_config
    from horizonrl.train.run import TrainingRun
    from horizonrl.train.tracking import read_metrics

    settings = [
        *TINY_COIN,
        "train.steps=1",
        "train.failure_penalties={'1.1': 0.5, '1.5': 0.25}",
        f"output_dir={tmp_path}",
        "name=signals",
    ]
    summary = TrainingRun(load_config("configs/calc.yaml", settings)).run()
    assert summary["finished"]
    (step,) = [m for m in read_metrics(tmp_path / "signals" / "metrics.jsonl") if "reward_mean" in m]
    rates = step["failure_signals/rate_1.1"] * 0.5 + step["failure_signals/rate_1.5"] * 0.25
    assert step["failure_signals/penalty_mean"] == pytest.approx(rates)
