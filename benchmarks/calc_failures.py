"""Where does a calc policy go wrong? Sorts every episode of held-out eval files by its first error.

Each episode of ``RUN/eval/*.jsonl`` (``start.jsonl`` after SFT, ``step_N.jsonl`` after RL) is
compared with its task's reference steps (``data.steps``; the held-out tasks are rebuilt from the
run's config, as its own eval chose them) and counted once, in the first category that fits:

- ``solved``: the episode earned the answer's reward;
- ``bare_number``: a calculator expression that is a number alone (``"6245"``), no operation;
- ``bad_expression``: an expression the calculator rejects;
- ``step1_wrong``: no call, or the first call's value is not the first reference step's;
- ``stopped_after_1``: a right first step and no second call;
- ``step2_undoes_step1``: the second call gives back a number of the first expression (``381 * 14``,
  then ``5334 / 14``);
- ``step2_other_wrong``: any other wrong second step or answer.

Prints one line per file: ``FILE category=count ...`` (most frequent first).

    python benchmarks/calc_failures.py RUN/eval/start.jsonl RUN/eval/step_000008.jsonl \
        [--config RUN/config.yaml]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path
from typing import Any

from horizonrl.config import load_config
from horizonrl.envs.calculator import CalculatorError, calculate
from horizonrl.envs.factory import eval_tasks
from horizonrl.toolcalls import parse_tool_calls

_NUMBER_ALONE = re.compile(r"[\d.,\s]+")


def expressions(messages: list[dict[str, Any]]) -> list[str]:
    """The calculator expressions of an episode, read from each turn as the agent loop read them."""
    calls = [
        c for m in messages if m.get("role") == "assistant" for c in parse_tool_calls(str(m["content"])).calls
    ]
    # a call without an expression (``{"answer": …}``) is one the env refused: it computed nothing
    written = [c.arguments.get("expression") for c in calls if c.name == "calculator"]
    return [e for e in written if isinstance(e, str)]


def first_error(record: dict[str, Any], steps: list[str]) -> str:
    if record["reward"] >= 1.0:
        return "solved"
    calls = expressions(record["messages"])
    if any(_NUMBER_ALONE.fullmatch(e) for e in calls):
        return "bare_number"
    try:
        values = [calculate(e) for e in calls]
    except CalculatorError:  # a malformed or unsupported expression
        return "bad_expression"
    if not values or values[0] != calculate(steps[0]):
        return "step1_wrong"
    if len(values) < 2:
        return "stopped_after_1"
    if any(values[1] == int(n) for n in re.findall(r"\d+", calls[0])):
        return "step2_undoes_step1"
    return "step2_other_wrong"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("eval_files", nargs="+", type=Path)
    parser.add_argument("--config", default="configs/calc.yaml", help="the run's config (RUN/config.yaml)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    tasks = {
        t.id: t
        for t in eval_tasks(
            config.env, config.eval.split, config.eval.num_tasks, config.eval.seed, config.eval.tasks
        )
    }
    for path in args.eval_files:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        unknown = [r["task_id"] for r in records if r["task_id"] not in tasks]
        if unknown:
            print(f"{path}: task {unknown[0]!r} is not a held-out task of {args.config}", file=sys.stderr)
            return 2
        counts = collections.Counter(first_error(r, tasks[r["task_id"]].data["steps"]) for r in records)
        print(str(path), " ".join(f"{k}={v}" for k, v in counts.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
