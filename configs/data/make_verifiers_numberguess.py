"""Regenerate verifiers_numberguess.jsonl: task data rows for the verifiers example env
examples/verifiers_envs/numberguess.py (run once; the output is committed). Nothing is downloaded:
each row is the env's task data (``GuessData``: prompt, system_prompt, secret, range, guesses) as
verifiers validates it, plus a ``split`` key that the adapter reads.

    .venv/bin/python configs/data/make_verifiers_numberguess.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("verifiers_numberguess.jsonl")
SYSTEM_PROMPT = "You are playing a guessing game. Reply with one whole number: your guess."
ASKS = [
    "I am thinking of a whole number from {low} to {high}. Guess it.",
    "Guess my secret number. It is between {low} and {high}.",
    "Pick a whole number from {low} to {high}: you have {n} guesses to find mine.",
]


def main() -> None:
    rng = random.Random(0)
    rows = []
    for i in range(64):
        low, high, n = 1, 6, 3
        rows.append(
            {
                "id": f"guess-{i:03d}",
                "prompt": rng.choice(ASKS).format(low=low, high=high, n=n),
                "system_prompt": SYSTEM_PROMPT,
                "secret": rng.randint(low, high),
                "low": low,
                "high": high,
                "max_guesses": n,
                "split": "train" if i < 48 else "test",
            }
        )
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
