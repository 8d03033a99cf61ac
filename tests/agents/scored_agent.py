"""A test agent program: two chat turns through the policy server, then a reward of its own.

The reward depends on what was sampled (the first reply's length), so the samples of one task get
different rewards and a training step has a signal, whatever a tiny random model writes. With
HORIZON_TEST_BEHAVIOUR=crash/hang it fails the way users' programs do."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
from openai import OpenAI

behaviour = os.environ.get("HORIZON_TEST_BEHAVIOUR", "")
task = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
sample = int(task["session_id"].rsplit("#", 1)[1])
if behaviour == "crash" and sample == 0:
    print("boom: the agent crashed", file=sys.stderr)
    sys.exit(3)
if behaviour == "hang" and sample == 1:
    time.sleep(600)
client = OpenAI(default_headers={"X-Session-Id": task["session_id"]}, max_retries=0)
messages = list(task["messages"])
first = client.chat.completions.create(model=task["model"], messages=messages, max_tokens=8)
messages += [
    {"role": "assistant", "content": first.choices[0].message.content},
    {"role": "user", "content": "Go on."},
]
client.chat.completions.create(model=task["model"], messages=messages, max_tokens=8)
reward = (first.usage.completion_tokens % 3) / 2 + 0.1 * sample
url = f"{os.environ['HORIZON_BASE_URL']}/v1/horizon/sessions/{quote(task['session_id'], safe='')}/reward"
httpx.post(url, json={"reward": reward}, headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
