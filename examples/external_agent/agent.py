"""A plain OpenAI-client agent: the kind of program `agent.kind: external` trains.

It knows nothing about HorizonRL's internals. It reads its task (messages and tools) from the file
it is given, asks the model through the official `openai` client, runs the tools the model calls
through the env's step endpoint, and stops when the episode is over or its turns run out. The
policy server records every token it samples under the session id, and the trainer turns that
session into a trajectory.

    python agent.py --task TASK_FILE          # OPENAI_BASE_URL, OPENAI_API_KEY, HORIZON_* set by the runner
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from urllib.parse import quote

import httpx
from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", required=True, help="the task file (messages, tools, session id)")
    parser.add_argument("--max-turns", type=int, default=None)
    args = parser.parse_args()
    task = json.loads(Path(args.task).read_text(encoding="utf-8"))
    session = task["session_id"]
    client = OpenAI(default_headers={"X-Session-Id": session}, max_retries=0, timeout=600)
    step_url = f"{os.environ['HORIZON_BASE_URL']}/v1/horizon/sessions/{quote(session, safe='')}/step"
    auth = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    messages = list(task["messages"])
    max_turns = args.max_turns or task.get("max_turns") or 6
    with httpx.Client(timeout=600) as http:
        for _ in range(max_turns):
            reply = client.chat.completions.create(
                model=task["model"], messages=messages, tools=task["tools"]
            )
            message = reply.choices[0].message
            messages.append(
                message.model_dump(
                    exclude_none=True, exclude={"refusal", "annotations", "audio", "function_call"}
                )
            )
            if not message.tool_calls:  # no readable call: tell the model how to go on, as a user would
                messages.append({"role": "user", "content": "Call one of the tools in a <tool_call> block."})
                continue
            step = http.post(step_url, json={}, headers=auth)
            step.raise_for_status()
            result = step.json()
            messages.extend(result["messages"])
            if result["done"]:
                break


if __name__ == "__main__":
    main()
