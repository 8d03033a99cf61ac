"""The host of an agent-code candidate inside its sandbox (standard library only; copied there).

``python -I -c "import agent_host; agent_host.main()" < request.json``: imports the candidate's
``agent.py``, calls ``act(turn)`` once and prints ``{"ok": answer}`` or ``{"error": ...}``. The
answer is checked here, so the trainer only ever receives one of the two valid shapes:

- ``{"ask": [{"role": ..., "content": ...}, ...]}``: the host should ask the model these messages
  and call ``act`` again with the reply appended to ``turn["replies"]``;
- ``{"action": "text of the assistant turn"}``: the turn, in the tool-call format the env reads.

Either may carry ``"memory"``: a JSON object handed back as ``turn["memory"]`` on the next calls of
the same episode (without it, the memory stays as it was).
"""

import json
import sys

ROLES = ("system", "user", "assistant", "tool")
MAX_MEMORY_CHARS = 65536


def check_answer(answer):
    if not isinstance(answer, dict):
        raise TypeError(f"act() returned {type(answer).__name__}, expected a dict with 'ask' or 'action'")
    if ("ask" in answer) == ("action" in answer):
        raise ValueError("act() must return exactly one of 'ask' (messages) or 'action' (text)")
    if "action" in answer and not isinstance(answer["action"], str):
        raise TypeError("'action' must be a string (the assistant turn)")
    if "ask" in answer:
        asked = answer["ask"]
        if not isinstance(asked, list) or not asked:
            raise TypeError("'ask' must be a non-empty list of {'role', 'content'} messages")
        for m in asked:
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise TypeError(
                    f"'ask' messages need a role in {ROLES} and string content, got {str(m)[:80]}"
                )
    if "memory" in answer:
        memory = answer["memory"]
        if not isinstance(memory, dict) or len(json.dumps(memory)) > MAX_MEMORY_CHARS:
            raise TypeError(f"'memory' must be a JSON object of at most {MAX_MEMORY_CHARS} characters")
    return {k: answer[k] for k in ("ask", "action", "memory") if k in answer}


def main():
    request = json.load(sys.stdin)
    try:
        import agent

        result = {"ok": check_answer(agent.act(request["turn"]))}
    except BaseException as exc:
        result = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    json.dump(result, sys.stdout)
