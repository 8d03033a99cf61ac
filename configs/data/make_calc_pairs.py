"""Regenerate calc_pairs.jsonl: DPO preference pairs on the calc env (run once; output is committed).

Each pair is one episode of the calc env's scripted oracle run through the real agent loop, so the
messages are exactly what the agent records: ``prompt`` is the env's system and user messages,
``chosen`` the oracle's calculator calls, their results and the correct ``finish``, ``rejected`` the
same conversation with a wrong final answer (an off-by error, a swapped digit or the previous
intermediate result: plausible slips).

    .venv/bin/python configs/data/make_calc_pairs.py [N]
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

from horizonrl.agent.loop import Agent, AgentConfig
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.calc import CalcEnv
from horizonrl.models import load_tokenizer
from horizonrl.toolcalls import format_tool_call
from horizonrl.train.sft import oracle_demos

OUT = Path(__file__).with_name("calc_pairs.jsonl")


def wrong_answer(answer: int, steps: list[str], rng: random.Random) -> int:
    """A plausible wrong final answer."""
    kind = rng.choice(["offby", "digits", "previous"])
    if kind == "previous" and len(steps) > 1:
        previous = int(steps[-1].split()[0])  # the last step's left operand: the result before it
        if previous != answer:
            return previous
    if kind == "digits" and answer >= 10:
        text = list(str(answer))
        i = rng.randrange(len(text) - 1)
        text[i], text[i + 1] = text[i + 1], text[i]
        swapped = int("".join(text))
        if swapped != answer and not str(swapped).startswith("0"):
            return swapped
    return answer + rng.choice([-1, 1]) * rng.choice([1, 10, 100])


def main(n: int = 16) -> None:
    tokenizer = load_tokenizer("smollm2-135m")
    agent = Agent(tokenizer, None, SamplingParams(), AgentConfig(max_turns=8, max_total_tokens=4096))
    tasks = CalcEnv.make_tasks("train", n, 2000, CalcEnv.Options())
    demos = asyncio.run(oracle_demos(agent, CalcEnv, tasks, CalcEnv.oracle()))
    rng = random.Random(0)
    lines = []
    for task, traj in zip(tasks, demos, strict=True):
        assert traj.success, traj.finish
        messages = [m.to_dict() for m in traj.messages]
        prompt, chosen = messages[:2], messages[2:]
        final = chosen[-1]
        right = str(task.data["answer"])
        wrong = str(wrong_answer(task.data["answer"], task.data["steps"], rng))
        bad_final = {
            **final,
            "content": f"So the answer is {wrong}.\n{format_tool_call('finish', {'answer': wrong})}",
            "tool_calls": [
                {
                    **final["tool_calls"][0],
                    "function": {"name": "finish", "arguments": json.dumps({"answer": wrong})},
                }
            ],
        }
        assert right in final["content"] and right != wrong
        pair = {"id": task.id, "prompt": prompt, "chosen": chosen, "rejected": [*chosen[:-1], bad_final]}
        lines.append(json.dumps(pair, ensure_ascii=False))
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} pairs to {OUT}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
