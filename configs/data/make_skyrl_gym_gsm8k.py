"""Regenerate skyrl_gym_gsm8k.jsonl: small GSM8K-style rows for skyrl-gym's ``gsm8k`` env (run once;
the output is committed). Nothing is downloaded: one- and two-step word problems over small numbers,
in the row format of skyrl-train's ``examples/gsm8k/gsm8k_dataset.py`` (``prompt``,
``env_class: gsm8k``, ``reward_spec.ground_truth``, ``extra_info.split``), so the file is also a
valid skyrl-train dataset. The prompt is a system message asking for the ``#### <answer>`` line and
the question: with skyrl-train's own instruction after the question the embedded SmolLM2-135M wrote
that line in 0 of 16 sampled replies, with this system message in 1 of 16.

    .venv/bin/python configs/data/make_skyrl_gym_gsm8k.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("skyrl_gym_gsm8k.jsonl")
SYSTEM = (
    'Solve the problem in one or two short steps. End your reply with a last line "#### <answer>", '
    "where <answer> is the number alone."
)
NAMES = ["Tom", "Ana", "Sam", "Mia", "Leo", "Zoe", "Ben", "Ivy"]
THINGS = ["apples", "books", "stickers", "marbles", "pencils", "cookies"]


def problem(rng: random.Random) -> tuple[str, int, str]:
    """(question, answer, worked solution) of one of five shapes."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 20), rng.randint(2, 9)
    shape = rng.randrange(5)
    if shape == 0:
        q, ans, how = (
            f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
            a + b,
            "+",
        )
    elif shape == 1:
        a = a + b
        q, ans, how = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?", a - b, "-"
    elif shape == 2:
        q, ans, how = (
            f"{name} buys {b} bags with {a} {thing} in each bag. How many {thing} is that?",
            a * b,
            "*",
        )
    elif shape == 3:
        a = a * b
        q = f"{name} shares {a} {thing} equally among {b} friends. How many {thing} does each friend get?"
        ans, how = a // b, "/"
    else:
        c = rng.randint(1, a)
        q = f"{name} has {a} {thing}, gets {b} more and then loses {c}. How many {thing} are there now?"
        return q, a + b - c, f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}\n#### {a + b - c}"
    return q, ans, f"{a} {how} {b} = {ans}\n#### {ans}"


def rows(split: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for index in range(n):
        question, answer, solution = problem(rng)
        out.append(
            {
                "data_source": "horizonrl/skyrl_gym_gsm8k",
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                "env_class": "gsm8k",
                "reward_spec": {"method": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
            }
        )
    return out


if __name__ == "__main__":
    lines = rows("train", 64, 0) + rows("test", 32, 1)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in lines))
    print(f"wrote {len(lines)} rows to {OUT}")
