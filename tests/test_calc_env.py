"""The built-in ``calc`` env: task generation, the safe calculator, finish rewards, tool specs,
the oracle and registration."""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction

import pytest
from pydantic import ValidationError

import horizonrl.envs
from horizonrl.envs.calc import CalcEnv, CalcOptions
from horizonrl.envs.calc_problems import generate_problem
from horizonrl.envs.calculator import CalculatorError, calculate
from horizonrl.envs.registry import parse_env_options
from horizonrl.errors import ConfigError
from horizonrl.types import Action, Message, Task, ToolCall


def tasks(split: str = "train", n: int = 50, seed: int = 0, **options: int) -> list[Task]:
    return CalcEnv.make_tasks(split, n, seed, CalcOptions(**options))


def parse_calls(text: str) -> list[ToolCall]:
    """Stand-in for the agent's parser: the JSON bodies between <tool_call> tags."""
    bodies = re.findall(r"<tool_call>(.*?)</tool_call>", text, flags=re.DOTALL)
    return [
        ToolCall(id=f"call_{i}", name=body["name"], arguments=body["arguments"])
        for i, body in enumerate(json.loads(b) for b in bodies)
    ]


async def call(env: CalcEnv, name: str, **arguments: object) -> tuple[str, float, bool, dict]:
    result = await env.step(Action(text="", tool_calls=[ToolCall(id="c", name=name, arguments=arguments)]))
    (obs,) = result.observations
    assert obs.role == "tool" and obs.tool_call_id == "c"
    return obs.content, result.reward, result.done, result.info


async def started_env(answer: int = 14497) -> CalcEnv:
    env = CalcEnv()
    task = Task(id="t", env="calc", data={"question": "q?", "answer": answer, "steps": []})
    await env.reset(task)
    return env


# --- task generation ---


def test_make_tasks_is_deterministic_for_a_seed() -> None:
    first, again = tasks(seed=7), tasks(seed=7)
    assert [t.model_dump() for t in first] == [t.model_dump() for t in again]
    assert [t.data["question"] for t in tasks(seed=8)] != [t.data["question"] for t in first]
    # a task depends on its index, not on how many were asked for
    assert tasks(n=5, seed=7) == first[:5]


def test_task_fields() -> None:
    task = tasks(split="test", n=43)[42]
    assert task.id == "calc-test-000042" and task.env == "calc" and task.split == "test"
    assert set(task.data) == {"question", "answer", "steps", "clauses"}
    assert isinstance(task.data["question"], str) and task.data["question"].endswith("?")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clauses_are_the_sentences_of_the_steps_then_the_question(seed: int) -> None:
    for task in tasks("train", 100, seed=seed, min_ops=1, max_ops=5):
        clauses, steps, question = task.data["clauses"], task.data["steps"], task.data["question"]
        assert len(clauses) == len(steps) + 1 and question.endswith(" ".join(clauses))
        assert clauses[-1].endswith("?") and all(c.endswith(".") for c in clauses[:-1])
        for clause, step in zip(clauses[:-1], steps, strict=True):
            # the step's number (its second operand, or for "N boxes with k each" both) is in its sentence
            _, op, b = step.split()
            shown = clause.replace(",", "")
            assert b in shown.split() or b in re.findall(r"\d+", shown), (clause, step)
            if op == "+":
                assert re.search(r"more|extra|another", clause), clause
            elif op == "-":
                assert re.search(r"taken|gives away|thrown|sold", clause), clause
            elif op == "/":
                assert "equally" in clause, clause


def oracle_leads(task: Task, style: str) -> list[str]:
    """The first line of each turn the oracle of ``style`` writes for ``task``, calls and finish."""
    oracle, messages = CalcEnv.oracle(CalcOptions(oracle_style=style)), []
    for _ in range(len(task.data["steps"]) + 1):
        messages.append(Message(role="assistant", content=oracle.act(task, messages)))
    return [m.content.split("\n")[0] for m in messages]


def test_quoted_oracle_quotes_each_sentence_names_the_operation_then_quotes_the_question() -> None:
    task = tasks("test", 2)[1]
    assert oracle_leads(task, "quoted") == [
        "A library has 6951 shelves with 79 books each. So I multiply.",
        "210 of the books in the library turn out to be damaged and are thrown away. So I subtract.",
        "What is the final number of books in the library? The answer is 548919.",
    ]
    plain = Task(id="f", env="calc", data={k: v for k, v in task.data.items() if k != "clauses"})
    assert oracle_leads(plain, "quoted")[0] == "First, I compute 6951 * 79."


def test_oracle_writes_plain_turns_by_default() -> None:
    task = tasks("test", 2)[1]
    assert CalcEnv.oracle().act(task, []).startswith("First, I compute 6951 * 79.\n<tool_call>")
    assert CalcEnv.oracle(CalcOptions()).act(task, []).startswith("First, I compute 6951 * 79.")


def test_a_task_is_the_generators_problem_for_its_own_rng() -> None:
    """The env only picks the rng (split, seed, index) and the number of steps; the problem is
    :func:`generate_problem`'s, so the generator stands alone."""
    task = tasks("test", 3, seed=4, min_ops=2, max_ops=3, max_digits=5)[2]
    rng = random.Random("calc:test:4:2")
    n_ops = rng.randint(2, 3)
    assert task.data == generate_problem(rng, n_ops, 5) and len(task.data["steps"]) == n_ops


def test_train_and_test_questions_are_disjoint() -> None:
    train = {t.data["question"] for t in tasks("train", 300)}
    test = {t.data["question"] for t in tasks("test", 300)}
    assert len(train) == 300 and len(test) == 300
    assert not train & test


def test_unknown_split_names_valid_splits() -> None:
    with pytest.raises(ConfigError, match=r"'dev'.*train.*test"):
        tasks("dev")


@pytest.mark.parametrize(
    "options",
    [{}, {"min_ops": 1, "max_ops": 1}, {"min_ops": 5, "max_ops": 8}, {"max_digits": 1}, {"max_digits": 8}],
)
def test_answers_are_integers_computed_by_the_steps(options: dict[str, int]) -> None:
    opts = CalcOptions(**options)
    for task in tasks(n=150, seed=3, **options):
        steps, answer = task.data["steps"], task.data["answer"]
        assert opts.min_ops <= len(steps) <= opts.max_ops
        assert isinstance(answer, int) and answer > 0
        value = None
        for i, step in enumerate(steps):
            left, op, right = step.split()
            assert op in "+-*/"
            if i > 0:  # each step continues from the previous result
                assert int(left) == value
            exact = Fraction(int(left)) / int(right) if op == "/" else calculate(step)
            assert exact == int(exact) and exact >= 0, step  # exact division, no negatives
            value = int(exact)
            assert calculate(step) == value
        assert value == answer


def test_problems_are_varied_and_multi_digit() -> None:
    generated = tasks(n=300)
    shapes = {re.sub(r"[\d,]+", "#", t.data["question"]) for t in generated}
    assert len(shapes) > 150
    units = ("bolts", "books", "eggs", "cookies", "apples", "stickers", "screws", "seeds", "cans", "pencils")
    assert all(any(f" {u} " in t.data["question"] for t in generated) for u in units)  # many stories
    assert all(len(t.data["steps"]) >= 2 for t in generated)
    for task in generated:  # every problem involves a number of at least max_digits (4) digits
        numbers = [*re.findall(r"\d+", " ".join(task.data["steps"])), str(task.data["answer"])]
        assert max(len(x) for x in numbers) >= 4, task.data["steps"]


def test_options_validate_op_range() -> None:
    with pytest.raises(ValidationError, match="min_ops"):
        CalcOptions(min_ops=4, max_ops=3)
    with pytest.raises(ConfigError, match="min_ops"):
        parse_env_options("calc", {"min_ops": 4, "max_ops": 3})
    with pytest.raises(ConfigError, match="max_digits"):
        parse_env_options("calc", {"max_digits": 0})
    assert CalcEnv.Options.model_fields["max_ops"].description


# --- calculator ---


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("4817 * 23", "110791"),
        ("(4817 * 23 - 9312) / 7", "14497"),
        ("4,817 * 23", "110791"),
        ("4,817 x 23", "110791"),
        ("4817×23", "110791"),
        ("101479 ÷ 7", "14497"),
        ("7 / 2", "3.5"),
        ("1 / 3", "0.333333333333"),
        ("7 // 2", "3"),
        ("7 % 4", "3"),
        ("2 ** 10", "1024"),
        ("-3 + +5", "2"),
        ("1.5 + 1.5", "3"),
        (" 12 = ", "12"),
        ("123456789123456789 * 10 / 10", "123456789123456789"),
    ],
)
async def test_calculator_evaluates(expression: str, expected: str) -> None:
    env = await started_env()
    content, reward, done, _ = await call(env, "calculator", expression=expression)
    assert content == expected
    assert reward == 0.0 and not done


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "function call"),
        ("__import__('os').system('ls')", "not allowed"),
        ("(1).__class__", "attribute access"),
        ("x + 1", "name 'x'"),
        ("abs(-1)", "function call"),
        ("9**9**9", "exponent"),
        ("10 ** 200", "exponent"),
        ("99999 ** 99", "too large"),
        ("1" * 150 + " * " + "1" * 40, "too large"),
        ("1+" * 100 + "1", "too long"),
        ("'abc'", "only numbers"),
        ("[1, 2]", "not allowed"),
        ("1,2345", "thousands separators"),
        ("2 ^ 3", "\\*\\*"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "could not parse"),
        ("", "empty"),
    ],
)
def test_calculator_rejects_dangerous_or_bad_input(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message):
        calculate(expression)


async def test_calculator_errors_are_observations() -> None:
    env = await started_env()
    for expression in ("1 / 0", "5 // (3 - 3)", "4 % 0"):
        content, reward, done, info = await call(env, "calculator", expression=expression)
        assert content == "Error: division by zero"
        assert not done and reward == 0.0 and info["tool_errors"] == 1
    content, *_ = await call(env, "calculator", expression="__import__('os').system('echo hi')")
    assert content.startswith("Error: ") and "not allowed" in content


# --- finish ---


@pytest.mark.parametrize("answer", ["14497", "14,497", " 14497 ", "14497.0"])
async def test_finish_correct_answer_gets_reward(answer: str) -> None:
    env = await started_env(14497)
    content, reward, done, info = await call(env, "finish", answer=answer)
    assert reward == 1.0 and done and info["correct"] is True
    assert content == f"Answer {answer.strip()} recorded."


@pytest.mark.parametrize("answer", ["14496", "14497.5", "-14497", "144,970"])
async def test_finish_wrong_answer_gets_no_reward(answer: str) -> None:
    env = await started_env(14497)
    content, reward, done, info = await call(env, "finish", answer=answer)
    assert reward == 0.0 and done and info["correct"] is False
    assert "14497" not in content.replace(answer.strip(), "")  # the true answer is not revealed


@pytest.mark.parametrize(
    "answer", ["fourteen thousand", "", "14497 bolts", "1,4497", "nan", "1e999999999", "1/0"]
)
async def test_finish_unparseable_answer_ends_with_no_reward(answer: str) -> None:
    env = await started_env(14497)
    content, reward, done, info = await call(env, "finish", answer=answer)
    assert reward == 0.0 and done
    assert info["correct"] is False and "not a number" in info["parse_error"]
    assert "recorded" in content


# --- tools, reset, oracle, registry ---


def test_tool_specs() -> None:
    specs = {spec.name: spec for spec in CalcEnv().tools}
    assert list(specs) == ["calculator", "finish"]
    calc = specs["calculator"]
    assert calc.description.startswith("Evaluate an arithmetic expression")
    assert calc.parameters["properties"]["expression"]["type"] == "string"
    assert "e.g." in calc.parameters["properties"]["expression"]["description"]
    assert calc.parameters["required"] == ["expression"]
    assert specs["finish"].parameters["required"] == ["answer"]
    assert specs["finish"].parameters["properties"]["answer"]["type"] == "string"


async def test_reset_gives_instructions_and_the_question() -> None:
    task = tasks(n=1)[0]
    messages = await CalcEnv().reset(task)
    assert [m.role for m in messages] == ["system", "user"]
    system = messages[0].content
    assert "calculator" in system and "finish" in system
    assert "<tool_call>" not in system and "{" not in system  # the syntax is the agent layer's job
    assert messages[1].content == task.data["question"]


@pytest.mark.parametrize("split", ["train", "test"])
async def test_oracle_solves_every_task(split: str) -> None:
    oracle = CalcEnv.oracle()
    env = CalcEnv()
    for task in tasks(split, 200, seed=11, min_ops=1, max_ops=5):
        messages: list[Message] = await env.reset(task)
        for _ in range(len(task.data["steps"]) + 1):
            text = oracle.act(task, messages)
            calls = parse_calls(text)
            assert len(calls) == 1
            messages.append(Message(role="assistant", content=text, tool_calls=calls))
            result = await env.step(Action(text=text, tool_calls=calls))
            messages.extend(result.observations)
            assert not result.observations[0].content.startswith("Error"), result.observations[0].content
            if result.done:
                break
        assert result.done and result.reward == 1.0 and result.info["correct"], task.id
        # every intermediate the oracle saw is the calculator's integer result
        tool_outputs = [m.content for m in messages if m.role == "tool"][:-1]
        assert all(out.isdigit() for out in tool_outputs)


def test_registry_finds_calc_and_validates_options() -> None:
    assert horizonrl.envs.get_env_class("calc") is CalcEnv
    assert "calc" in horizonrl.envs.list_envs()
    with pytest.raises(ConfigError, match="max_opz"):
        parse_env_options("calc", {"max_opz": 1})
    opts = parse_env_options("calc", {"max_ops": 5})
    assert isinstance(opts, CalcOptions) and opts.max_ops == 5


# --- step credit (a grounded process reward) ---


async def credited_env(step_credit: float = 0.5) -> tuple[CalcEnv, Task]:
    task = Task(id="t", env="calc", data={"question": "q?", "answer": 60, "steps": ["5 + 7", "12 * 5"]})
    env = CalcEnv(CalcOptions(step_credit=step_credit))
    await env.reset(task)
    return env, task


async def test_step_credit_pays_each_reproduced_step_and_tops_up_a_right_answer() -> None:
    env, _ = await credited_env(0.5)
    assert (await call(env, "calculator", expression="7 + 5"))[:2] == ("12", 0.25)  # same value, any order
    assert (await call(env, "calculator", expression="12 * 5"))[:2] == ("60", 0.25)
    _, reward, done, _ = await call(env, "finish", answer="60")
    assert done and reward == 1.0  # 1 + 0.5 in total
    assert env.metrics == {"success": 1.0}


async def test_step_credit_stops_at_the_first_wrong_result_and_a_wrong_answer_earns_none() -> None:
    env, _ = await credited_env(0.5)
    assert (await call(env, "calculator", expression="5 + 7"))[1] == 0.25
    assert (await call(env, "calculator", expression="12 + 5"))[1] == 0.0  # wrong operator
    assert (await call(env, "calculator", expression="12 * 5"))[1] == 0.0  # right value, but after a miss
    _, reward, done, _ = await call(env, "finish", answer="17")
    assert done and reward == 0.0 and env.metrics == {"success": 0.0}


async def test_a_right_answer_without_the_steps_is_worth_the_same() -> None:
    env, _ = await credited_env(0.5)
    assert (await call(env, "calculator", expression="(5 + 7) * 5"))[1] == 0.0
    _, reward, *_ = await call(env, "finish", answer="60")
    assert reward == 1.5


async def test_a_failed_calculator_call_ends_the_matching_prefix() -> None:
    env, _ = await credited_env(0.5)
    assert (await call(env, "calculator", expression="5 / 0"))[0] == "Error: division by zero"
    assert (await call(env, "calculator", expression="5 + 7"))[1] == 0.0


async def test_without_step_credit_only_the_answer_is_rewarded() -> None:
    env, _ = await credited_env(0.0)
    assert (await call(env, "calculator", expression="5 + 7"))[1] == 0.0
    assert (await call(env, "finish", answer="60"))[1] == 1.0


def test_partial_credit_is_not_success() -> None:
    from horizonrl.types import Trajectory

    def record(reward: float, metrics: dict[str, float]) -> Trajectory:
        return Trajectory(
            id="a",
            task_id="t",
            group_id="t",
            env="calc",
            messages=[],
            prompt_ids=[1],
            reward=reward,
            finish="finished",
            metrics=metrics,
        )

    assert not record(0.25, {"success": 0.0}).success  # the env's verdict wins over a shaped reward
    assert record(1.5, {"success": 1.0}).success
    assert record(1.0, {}).success  # envs without a verdict: a positive reward
    assert not record(0.0, {}).success


def test_counted_oracle_states_the_number_of_steps_in_every_turn() -> None:
    assert oracle_leads(tasks("test", 2)[1], "counted") == [
        "Step 1 of 2: I compute 6951 * 79.",
        "Step 2 of 2: I compute 549129 - 210.",
        "So the answer is 548919.",
    ]


async def test_with_credit_needs_attempt_giving_up_early_earns_nothing() -> None:
    task = Task(id="t", env="calc", data={"question": "q?", "answer": 60, "steps": ["5 + 7", "12 * 5"]})

    async def episode(*calls: tuple[str, str]) -> float | None:
        env = CalcEnv(CalcOptions(step_credit=0.5, credit_needs_attempt=True))
        await env.reset(task)
        earned = 0.0
        for name, arg in calls:
            key = "expression" if name == "calculator" else "answer"
            earned += (await call(env, name, **{key: arg}))[1]
        outcome = await env.evaluate()
        return earned if outcome is None else outcome

    assert await episode(("calculator", "5 + 7"), ("finish", "12")) == 0.0  # stopped after one step
    assert await episode(("calculator", "5 + 7"), ("finish", "12 * 5")) == 0.0  # not a number
    assert await episode(("calculator", "5 + 7")) == 0.0  # never finished
    assert await episode(("calculator", "5 + 7"), ("calculator", "12 + 5"), ("finish", "17")) == 0.25  # tried
    assert await episode(("calculator", "5 + 7"), ("calculator", "12 * 5"), ("finish", "60")) == 1.5
    assert await episode(("finish", "60")) == 1.5  # a right answer is worth the same however reached
