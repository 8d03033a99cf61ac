"""The chat-chain MAST detectors (analysis/chain_detectors.py) on small hand-made traces of a
ChatDev-style team writing ``below_zero``: a clean run shows no mode at all, and each rule fires on
the one change to it that shows its mode, through ``detect`` as `horizon analyze` calls it."""

from __future__ import annotations

from typing import Any

from horizonrl.analysis.chain_history import CONSENSUS, writes
from horizonrl.analysis.detectors import DETECTORS, detect
from horizonrl.analysis.mast import MODE_IDS
from horizonrl.analysis.trace import Step, StepRecord, Trace, TraceRecord
from horizonrl.multiagent.chain_record import ChainCheck, ChainFacts, ChainPhaseRun
from horizonrl.types import ToolCall

TASK = (
    "from typing import List\n\ndef below_zero(operations: List[int]) -> bool:\n"
    '    """Is the balance ever below zero?\n    >>> below_zero([1, 2, -4, 5])\n    True\n    """\n'
)
GOOD = (
    "def below_zero(operations):\n    total = 0\n    for op in operations:\n        total += op\n"
    "        if total < 0:\n            return True\n    return False\n"
)
BAD = "def below_zero(operations):\n    return sum(operations) < 0\n"
GUARDED = GOOD.replace("    total = 0\n", "    if not operations:\n        return False\n    total = 0\n")
PERMISSIONS = {
    "coding": {"programmer": ["write_file", "run_python"]},
    "code_review": {"reviewer": ["run_examples"], "programmer": ["write_file"]},
    "testing": {"tester": ["run_python"], "programmer": ["write_file", "run_examples"]},
}
RUN = ("run_examples", {})
PASSED = "[exit code 0]\n"
FAILED = "[exit code 1]\nFailed example:\n    below_zero([1, 2, -4, 5])\nExpected:\n    True\nGot:\n    False"
REFUSED = "Error: role 'cto' may not call write_file in phase 'coding' (it may call: nothing)."
ROLES = {"design": ["ceo", "cto"], "coding": ["cto", "programmer"], "code_review": ["reviewer", "programmer"]}
ROLES["testing"] = ["tester", "programmer"]


def write(code: str) -> tuple[str, dict[str, Any]]:
    return ("write_file", {"content": code})


def step(
    role: str, phase: str, text: str = "", *calls: tuple[str, dict[str, Any]], obs: str = ""
) -> StepRecord:
    tool_calls = [ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)]
    return StepRecord(role=role, phase=phase, text=text, tool_calls=tool_calls, observation=obs)


def clean_steps() -> list[StepRecord]:
    return [
        step(
            "ceo", "design", "below_zero takes the operations and says whether the balance dips below zero."
        ),
        step("cto", "design", "Keep a running total of the operations. <INFO> Finished"),
        step("cto", "coding", "Write below_zero with a running total."),
        step("programmer", "coding", "Here it is.", write(GOOD), obs="Wrote 7 lines to solution.py."),
        step("cto", "coding", "That is what we need. <INFO> Finished"),
        step("reviewer", "code_review", "Running the examples.", RUN, obs=PASSED),
        step("reviewer", "code_review", "The 1 example passes. <INFO> Finished"),
    ]


def chain_trace(
    steps: list[StepRecord],
    ended: dict[str, tuple[str, str | None]] | None = None,
    checks: tuple[tuple[int, str, bool], ...] = ((6, "test_and_fix", True), (6, "final", True)),
    final: str = GOOD,
    success: bool = True,
) -> Trace:
    """A trace of ``steps`` whose phase runs are their runs of one phase name, each ending as
    ``ended`` says (default: consensus by its last step's role)."""
    runs: list[ChainPhaseRun] = []
    for i, s in enumerate(steps):
        if runs and runs[-1].name == s.phase:
            runs[-1].last_step = i
        else:
            runs.append(
                ChainPhaseRun(
                    name=s.phase,
                    cycle=int(s.phase == "testing"),
                    roles=ROLES[s.phase],
                    first_step=i,
                    last_step=i,
                    ended="consensus",
                )
            )
    for run in runs:
        how, by = (ended or {}).get(run.name, ("consensus", steps[run.last_step].role))
        run.ended, run.consensus_by = how, by if how == "consensus" else None  # type: ignore[assignment]
    facts = ChainFacts(
        chain="software_company",
        entry_point="below_zero",
        permissions=PERMISSIONS,
        phases=runs,
        checks=[ChainCheck(after_step=a, phase=p, passed=ok) for a, p, ok in checks],
        final_code=final,
    )
    record = TraceRecord(id="t", env="humaneval", task=TASK, steps=steps, success=success, chain=facts)
    return record.trace()


def found(trace: Trace) -> dict[str, list[int]]:
    return {m: v.steps for m, v in detect(trace).items() if v.present}


def test_every_mode_but_2_2_has_a_detector_and_a_clean_run_shows_none():
    assert sorted(DETECTORS) == [m for m in MODE_IDS if m != "2.2"]
    assert found(chain_trace(clean_steps())) == {}
    # a failed run whose review ran the examples and saw them pass: the hidden tests caught what the
    # examples did not, so no mode of the team's own conduct (3.3: the reviewer approved it)
    assert set(found(chain_trace(clean_steps(), final=BAD, success=False))) == {"3.3"}


def test_1_1_the_final_code_must_define_the_entry_point():
    trace = chain_trace(clean_steps(), final="def below_zero_total(xs):\n    return False\n")
    assert found(trace)["1.1"] == [3]
    assert "1.1" in found(chain_trace(clean_steps(), final="def below_zero(:\n"))  # does not parse
    assert "1.1" in found(chain_trace(clean_steps(), final=TASK))  # the stub: only its docstring


def test_1_2_a_refused_tool_or_code_written_by_a_role_that_may_not_write():
    steps = clean_steps()
    steps[2] = step("cto", "coding", "I'll do it.", write(BAD), obs=REFUSED)
    trace = chain_trace(steps)
    assert found(trace)["1.2"] == [2]
    assert trace.chain and [w.at[0] for w in writes(trace.chain, trace)] == [3]  # refused: not a write
    steps = clean_steps()
    steps[6] = step("reviewer", "code_review", f"Use this instead:\n```python\n{GOOD}```\n<INFO> Finished")
    assert found(chain_trace(steps))["1.2"] == [6]
    steps = clean_steps()  # the programmer answering with a code block is its job
    steps[3] = step("programmer", "coding", f"Here it is:\n```python\n{GOOD}```")
    assert "1.2" not in found(chain_trace(steps))


def review(*turns: tuple[str, str | None, str]) -> list[StepRecord]:
    """The clean design and coding, then a review of (reviewer's text, programmer's code or None,
    what the reviewer's run of the examples says) turns."""
    steps = clean_steps()[:5]
    for said, code, run in turns:
        steps.append(step("reviewer", "code_review", "Running them.", RUN, obs=run))
        steps.append(step("reviewer", "code_review", said))
        calls = [write(code)] if code is not None else []
        steps.append(step("programmer", "code_review", "Done.", *calls, obs="Wrote it." if calls else ""))
    return steps


def test_1_4_a_failed_version_put_back_or_a_right_one_swapped_for_a_wrong_one_unasked():
    def last_check(steps: list[StepRecord]) -> tuple[tuple[int, str, bool], ...]:
        return ((len(steps) - 1, "test_and_fix", True), (len(steps) - 1, "final", True))

    steps = [*clean_steps()[:3], step("programmer", "coding", "Here.", write(BAD), obs="Wrote it.")]
    steps += review(("It fails: fix it.", GOOD, FAILED), ("Now shorter, please.", BAD, PASSED))[4:]
    assert found(chain_trace(steps, {"code_review": ("turn_cap", None)}, last_check(steps)))["1.4"] == [3, 10]
    steps = review(("Please add a docstring.", BAD, PASSED), ("It fails again: fix it.", GOOD, FAILED))
    assert found(chain_trace(steps, {"code_review": ("turn_cap", None)}, last_check(steps)))["1.4"] == [3, 7]
    # the swap the reviewer asked for, naming the code, is the review's doing (3.3), not forgetting;
    # and restoring the version the examples passed, after that change failed them, is progress
    steps[6] = step("reviewer", "code_review", "Use `sum(operations) < 0` instead.")
    modes = found(chain_trace(steps, {"code_review": ("turn_cap", None)}, last_check(steps)))
    assert "1.4" not in modes and "1.3" not in modes  # writing GOOD again changes the code: no repeat


def test_1_3_and_2_1_on_a_chain_count_what_changed_the_code():
    steps = review(("Guard the empty list, please.", GUARDED, PASSED), ("Thanks.", None, PASSED))
    checks = ((10, "test_and_fix", True), (10, "final", True))
    assert "1.3" not in found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks, final=GUARDED))
    steps = review(("Guard the empty list, please.", None, PASSED), ("Thanks.", None, PASSED))
    assert found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))["1.3"] == [5, 8]
    steps = clean_steps()  # the programmer posting its first turn's code again is 1.3, not a reset
    posted = step("programmer", "coding", f"```python\n{GOOD}```")
    steps[3:5] = [posted, step("cto", "coding", "Check it."), posted]
    modes = found(chain_trace(steps, checks=((7, "test_and_fix", True), (7, "final", True))))
    assert modes["1.3"] == [3, 5] and "2.1" not in modes
    steps[5] = step("programmer", "coding", clean_steps()[0].text)  # the opening again, after the code
    checks = ((7, "test_and_fix", True), (7, "final", True))
    assert found(chain_trace(steps, checks=checks))["2.1"] == [0, 5]


def test_1_5_a_phase_run_to_its_turn_cap_after_the_examples_passed():
    steps = [
        *clean_steps()[:5],
        step("reviewer", "code_review", "Running the examples.", RUN, obs=PASSED),
        step("reviewer", "code_review", "The 1 example passes."),
        step("programmer", "code_review", "Thanks."),
        step("reviewer", "code_review", "Anything else to say about below_zero? Let me think."),
    ]
    checks = ((8, "test_and_fix", True), (8, "final", True))
    assert found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))["1.5"] == [5, 8]
    steps[8] = step("reviewer", "code_review", "An empty list should give False: fix below_zero([]).")
    assert "1.5" not in found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))  # a fix
    steps[5] = step("reviewer", "code_review", "Running the examples.", RUN, obs=FAILED)
    assert "1.5" not in found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))
    # no run at all, but right code and a last exchange that changes nothing: idle to the cap
    steps[5] = step("reviewer", "code_review", "Tell me about your weekend plans.")
    steps[8] = step("reviewer", "code_review", "Anything else to say about below_zero? Let me think.")
    assert found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))["1.5"] == [8]
    steps[7] = step("programmer", "code_review", "Guarding.", write(GUARDED), obs="Wrote it.")
    assert "1.5" not in found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))  # a fix


def test_1_5_the_test_and_fix_cycles_run_out_with_the_examples_failing():
    steps = [
        *clean_steps(),
        step("tester", "testing", "below_zero([1, 2, -4, 5]) gives False: fix it."),
        step("programmer", "testing", "Here.", write(BAD), obs="Wrote it."),
    ]
    checks = ((6, "test_and_fix", False), (8, "final", False))
    trace = chain_trace(steps, {"testing": ("turn_cap", None)}, checks, final=BAD, success=False)
    assert found(trace)["1.5"] == [8]
    checks = ((6, "test_and_fix", False), (8, "final", True))
    assert "1.5" not in found(chain_trace(steps, {"testing": ("turn_cap", None)}, checks))


def test_2_3_long_talk_off_the_task_or_code_without_the_entry_point():
    steps = clean_steps()
    steps[0] = step("ceo", "design", "Our company should expand into new markets next quarter. " * 5)
    assert found(chain_trace(steps))["2.3"] == [0]
    steps[0] = step("ceo", "design", "The operations are deposits and withdrawals, in order. " * 5)
    assert "2.3" not in found(chain_trace(steps))  # names an argument of the signature
    steps = clean_steps()
    steps[3] = step(
        "programmer", "coding", "Here.", write("def balance(xs):\n    return 0\n"), obs="Wrote it."
    )
    assert found(chain_trace(steps))["2.3"] == [3]
    cli = GOOD + "\n\nif __name__ == '__main__':\n    import sys\n    print(below_zero(sys.argv[1:]))\n"
    steps[3] = step("programmer", "coding", "Here, with a command line.", write(cli), obs="Wrote it.")
    assert found(chain_trace(steps, final=cli))["2.3"] == [3]  # a feature nobody asked for
    steps = clean_steps()  # a closing remark, however chatty, is no drift
    steps[6] = step(
        "reviewer", "code_review", "Thanks for a lovely afternoon, see you all soon! " * 2 + CONSENSUS
    )
    assert "2.3" not in found(chain_trace(steps))


def test_2_4_a_turn_that_ends_on_a_failure_it_does_not_report():
    steps = [*clean_steps()[:5], step("reviewer", "code_review", "Let me run them.", RUN, obs=FAILED)]
    steps.append(step("programmer", "code_review", "Waiting for the review."))
    checks = ((6, "test_and_fix", False), (6, "final", False))
    assert found(chain_trace(steps, checks=checks, success=False))["2.4"] == [5]
    steps.insert(6, step("reviewer", "code_review", "The example below_zero([1, 2, -4, 5]) gives False."))
    checks = ((7, "test_and_fix", False), (7, "final", False))
    assert "2.4" not in found(chain_trace(steps, checks=checks, success=False))
    steps[6] = step("reviewer", "code_review", "The examples failed. Please fix the code.")
    assert found(chain_trace(steps, checks=checks, success=False))["2.4"] == [5, 6]  # only "it failed"
    steps[6] = step("reviewer", "code_review", "It fails: `sum(operations) < 0` misses a dip that recovers.")
    assert "2.4" not in found(chain_trace(steps, checks=checks, success=False))  # a diagnosis in code
    steps[6] = step("reviewer", "code_review", "The running total is never checked against zero.")
    assert "2.4" not in found(chain_trace(steps, checks=checks, success=False))  # names the code's total
    steps[5] = step("reviewer", "code_review", "Trying it.", ("run_python", {}), obs="[exit code 0]\nFalse")
    steps[6] = step("reviewer", "code_review", "Still wrong; look again.")
    assert found(chain_trace(steps, checks=checks, success=False))["2.4"] == [5, 6]  # its output withheld
    steps = [  # a programmer that acts on its own failed run by fixing the code needs to tell no one
        *clean_steps(),
        step("tester", "testing", "Try an empty list."),
        step("programmer", "testing", "Checking.", RUN, obs=FAILED),
        step("programmer", "testing", "Fixing.", write(GUARDED), obs="Wrote it."),
        step("programmer", "testing", "Done."),
    ]
    checks = ((6, "test_and_fix", False), (10, "final", True))
    assert "2.4" not in found(chain_trace(steps, {"testing": ("turn_cap", None)}, checks, final=GUARDED))


def test_2_5_a_requested_change_answered_without_any_change():
    steps = [
        *clean_steps()[:7],
        step("tester", "testing", "The examples pass; check the edge cases."),
        step("programmer", "testing", "Running them.", RUN, obs=PASSED),
        step("tester", "testing", "An empty list is wrong: fix below_zero([])."),
        step("programmer", "testing", "Sure, good point."),
    ]
    checks = ((6, "test_and_fix", False), (10, "final", True))
    assert found(chain_trace(steps, {"testing": ("turn_cap", None)}, checks))["2.5"] == [9, 10]
    steps[10] = step("programmer", "testing", "Fixed.", write(GUARDED), RUN, obs=f"Wrote it.\n{PASSED}")
    assert "2.5" not in found(chain_trace(steps, {"testing": ("turn_cap", None)}, checks))
    steps[10] = step("programmer", "testing", "Fixed.", write(GOOD + "\n"), RUN, obs=f"Wrote it.\n{PASSED}")
    assert found(chain_trace(steps, {"testing": ("turn_cap", None)}, checks))["2.5"] == [9, 10]  # unchanged


def test_2_6_claims_of_a_write_or_a_pass_the_step_does_not_back():
    steps = clean_steps()
    steps[3] = step("programmer", "coding", "I have written below_zero to solution.py.")
    assert found(chain_trace(steps))["2.6"] == [3]
    steps[3] = step("programmer", "coding", "I have written below_zero.", write(GOOD), obs="Wrote 7 lines.")
    assert "2.6" not in found(chain_trace(steps))
    steps = [
        *clean_steps()[:5],
        step("reviewer", "code_review", "Running below_zero's examples.", RUN, obs=FAILED),
    ]
    steps.append(step("reviewer", "code_review", "All examples pass. <INFO> Finished"))
    checks = ((6, "test_and_fix", False), (6, "final", False))
    assert found(chain_trace(steps, checks=checks, success=False))["2.6"] == [5, 6]
    steps[6] = step("reviewer", "code_review", "Make sure all examples pass: below_zero fails one.")
    assert "2.6" not in found(chain_trace(steps, checks=checks, success=False))  # a request, not a claim


def test_2_6_a_plan_to_run_or_to_use_code_the_turn_does_not_carry_out():
    steps = clean_steps()
    steps[5] = step("reviewer", "code_review", "I will run the examples now.")
    assert found(chain_trace(steps))["2.6"] == [5]
    steps = clean_steps()
    steps[3] = step(
        "programmer", "coding", "I'll keep a total with `total -= op`.", write(GOOD), obs="Wrote it."
    )
    assert found(chain_trace(steps))["2.6"] == [3]  # GOOD adds: total += op
    steps[3] = step(
        "programmer", "coding", "I'll keep a total with `total += op`.", write(GOOD), obs="Wrote it."
    )
    assert "2.6" not in found(chain_trace(steps))
    steps = [*clean_steps()[:4], step("programmer", "coding", "I have written it.")]  # true: written at 3
    steps += [step("cto", "coding", "I have written it."), *clean_steps()[5:]]  # an echo is 1.3
    assert "2.6" not in found(chain_trace(steps)) and "1.3" in found(chain_trace(steps))


def test_3_1_consensus_on_code_no_passing_run_checked():
    steps = [
        *clean_steps()[:5],
        step("reviewer", "code_review", "below_zero looks right to me. <INFO> Finished"),
    ]
    checks = ((5, "test_and_fix", False), (5, "final", False))
    assert found(chain_trace(steps, checks=checks, final=BAD, success=False))["3.1"] == [5]
    assert "3.1" not in found(chain_trace(steps))  # the code was right: its check passed
    steps[3] = step("programmer", "coding", "Here it is.", write(BAD), obs="Wrote it.")
    steps += [
        step("tester", "testing", "below_zero([1, 2, -4, 5]) gives False; keep a running total."),
        step("programmer", "testing", "Fixed.", write(GOOD), obs="Wrote it."),
    ]
    checks = ((5, "test_and_fix", False), (7, "test_and_fix", True), (7, "final", True))
    assert found(chain_trace(steps, checks=checks))["3.1"] == [5]  # a later cycle repaired it


def test_3_2_unrun_final_code_or_a_review_that_only_restates():
    steps = [*clean_steps(), step("tester", "testing", "Check below_zero([]).")]
    steps.append(step("programmer", "testing", "Updated.", write(GUARDED), obs="Wrote it."))
    checks = ((6, "test_and_fix", False), (8, "final", True))
    assert found(chain_trace(steps, {"testing": ("turn_cap", None)}, checks))["3.2"] == [8]
    steps[8] = step("programmer", "testing", "Noted.", write(GOOD + "# empty\n"), obs="Wrote it.")
    assert "3.2" not in found(chain_trace(steps, {"testing": ("turn_cap", None)}, checks))  # no change
    steps = clean_steps()  # a verdict with nothing run on the code since its last change
    steps[5:] = [step("reviewer", "code_review", "below_zero looks good. <INFO> Finished")]
    assert found(chain_trace(steps, checks=((5, "test_and_fix", True), (5, "final", True))))["3.2"] == [5]
    review = [Step(0, "generator", "2 * 3 = 6. Answer: 6"), Step(1, "verifier", "Correct, well done.")]
    trace = Trace(
        "g", "calc", "What is 2 * 3?", review, "finished", True, 1.0, ["generator", "verifier"], ["g"]
    )
    assert detect(trace)["3.2"].steps == [1]  # any trace: a review that recomputes nothing
    review[1] = Step(1, "verifier", "2 * 3 is 6: correct.")
    assert not detect(trace)["3.2"].present


def test_3_3_approving_failing_code_or_misreading_a_check():
    steps = clean_steps()  # the reviewer approved code that fails the hidden tests
    assert found(chain_trace(steps, final=BAD, success=False))["3.3"] == [6]
    steps[3] = step("programmer", "coding", "Here it is.", write(BAD), obs="Wrote it.")
    steps[5:] = [
        step("reviewer", "code_review", "The code is correct. <INFO> Finished"),
        step("tester", "testing", "below_zero([1, 2, -4, 5]) gives False; keep a running total."),
        step("programmer", "testing", "Fixed.", write(GOOD), obs="Wrote it."),
    ]
    checks = ((5, "test_and_fix", False), (7, "test_and_fix", True), (7, "final", True))
    assert found(chain_trace(steps, checks=checks))["3.3"] == [5]  # wrong when approved, repaired later
    steps = [
        *clean_steps()[:5],
        step("reviewer", "code_review", "Running below_zero's examples.", RUN, obs=PASSED),
    ]
    steps.append(step("reviewer", "code_review", "below_zero has a bug: it fails on negatives."))
    steps.append(step("programmer", "code_review", "I see."))
    checks = ((7, "test_and_fix", True), (7, "final", True))
    assert found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))["3.3"] == [6]
    steps[6] = step("reviewer", "code_review", "below_zero has no bug I can find; the 1 example passes.")
    assert "3.3" not in found(chain_trace(steps, {"code_review": ("turn_cap", None)}, checks))


def test_chain_rules_need_the_chain_state():
    chainless = chain_trace(clean_steps(), final="def other():\n    pass\n", success=False)
    chainless.chain = None
    assert not any(detect(chainless)[m].present for m in ("1.1", "1.2", "1.4", "2.3", "2.4", "2.5", "2.6"))
