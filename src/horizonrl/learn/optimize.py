"""Optimization through the optimizer role: read a candidate's recent episodes, write a new
version of one component.

- ``dynamics`` (dynamics-based): work out the environment's rules and the failure patterns the
  episodes show, and turn them into guidelines (a prompt) or into code that follows them;
- ``instruction`` (instruction-based): diagnose which of the agent's behaviours were wrong and
  why, and rewrite the instruction (a prompt) or the agent code to correct them.

The request is built by pure functions (:func:`episode_digest`, :func:`optimizer_messages`) and asked
for as a structured reply (``client.structured``): ``{"analysis": ..., "prompt": ...}`` or
``{"analysis": ..., "code": ...}`` (:func:`reply_model`; the analysis comes first so that a model
works out the rules or the mistakes before it writes the component, and both strings are bounded so
that a reply held to the schema ends within ``max_tokens``). A reply that is no such object is read
tolerantly as free text (:func:`parse_prompt`, :func:`parse_code`). A reply without the new
component, code that does not define ``act(turn)``, or a prompt past the token limit leaves the
candidate unchanged and is counted with its reason, never raised.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from horizonrl.learn.agent_code import DEFAULT_AGENT_CODE, check_agent_code
from horizonrl.learn.candidate import Components
from horizonrl.types import Trajectory


@dataclass
class Proposal:
    """What one optimization produced: new components, or None with the reason it was not kept."""

    components: Components | None
    reason: str = ""
    reply: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def episode_digest(trajs: Sequence[Trajectory], k: int, step_chars: int) -> str:
    """Up to ``k`` episodes, failures (lowest reward) first, each as its task, its numbered steps
    (action, then what came back, each cut to ``step_chars``) and its outcome."""
    chosen = sorted(trajs, key=lambda t: (t.success, t.reward))[:k]
    blocks = []
    for i, traj in enumerate(chosen, 1):
        msgs = traj.messages
        start = 2 if len(msgs) > 1 and msgs[0].role == "system" else 1
        task = msgs[start - 1].content if len(msgs) >= start else ""
        lines = [f"Episode {i}. Task: {_cut(task, step_chars * 2)}"]
        step = 0
        for m in msgs[start:]:
            if m.role == "assistant":
                step += 1
                lines.append(f"  step {step} action: {_cut(m.content, step_chars)}")
            else:
                lines.append(f"  step {step} result: {_cut(m.content, step_chars)}")
        verdict = "solved" if traj.success else "not solved"
        lines.append(f"  outcome: {verdict}, reward {traj.reward:.2f}, ended by {traj.finish}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "(no episodes)"


_GOALS = {
    "dynamics": (
        "First work out the environment's rules from these episodes: which actions exist, what "
        "each does, what makes an action fail, what earns reward, and the failure patterns the "
        "agent repeats. Then {change} so that an agent that follows it obeys those rules."
    ),
    "instruction": (
        "First diagnose the agent's wrong behaviours in these episodes: for each, what it did, why "
        "that was wrong, and what it should have done instead. Then {change} so that the agent "
        "stops making those mistakes."
    ),
}

_CHANGES = {
    "prompt": (
        "write the guidelines to add to the agent's instructions",
        'Reply with one JSON object, {"analysis": <your analysis, briefly>, "prompt": <the complete '
        "new guidelines>}. Keep the guidelines short: a few imperative lines.",
    ),
    "agent_code": (
        "rewrite the agent's code",
        "The code defines act(turn). turn has 'messages' (list of {role, content}), 'tools' (the tool "
        "specs), 'replies' (the model's replies to this turn's asks so far) and 'memory' (a dict kept "
        'across the episode\'s turns). act returns {"ask": messages} to ask the model, or '
        '{"action": text} to take the turn (a tool call in the format the environment reads); '
        'either may add "memory": dict. Standard library only. Reply with one JSON object, '
        '{"analysis": <your analysis, briefly>, "code": <the complete new module>}.',
    ),
}

#: characters of a structured reply per token of its budget (bounds the reply's strings)
CHARS_PER_TOKEN = 3
#: the most characters of the analysis in a structured reply
ANALYSIS_CHARS = 600


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


def reply_model(target: str, max_tokens: int, max_prompt_tokens: int | None = None) -> type[BaseModel]:
    """The optimizer's reply for ``target``: ``analysis`` then the new component (``prompt`` or
    ``code``), their lengths bounded so that both fit ``max_tokens`` (the analysis takes at most a
    quarter); a prompt is also at most ``8 * max_prompt_tokens`` characters."""
    return _reply_model(target, max_tokens, max_prompt_tokens)


@lru_cache(maxsize=32)
def _reply_model(target: str, max_tokens: int, max_prompt_tokens: int | None) -> type[BaseModel]:
    chars = max(CHARS_PER_TOKEN * max_tokens - 64, 16)
    analysis = max(min(ANALYSIS_CHARS, chars // 4), 1)
    component = chars - analysis
    if target == "prompt" and max_prompt_tokens is not None:
        component = min(component, 8 * max_prompt_tokens)
    field_name, what = (
        ("prompt", "The complete new guidelines: a few imperative lines.")
        if target == "prompt"
        else ("code", "The complete new agent module (Python) that defines act(turn).")
    )
    return create_model(
        "NewGuidelines" if target == "prompt" else "NewAgentCode",
        __base__=_Closed,
        analysis=(str, Field(max_length=analysis, description="What the episodes show, briefly.")),
        **{field_name: (str, Field(min_length=1, max_length=component, description=what))},
    )


def optimizer_messages(
    optimization: str, target: str, instructions: str, current: str, digest: str
) -> list[dict[str, str]]:
    """The optimizer role's request for one optimization of ``target``."""
    change, answer = _CHANGES[target]
    what = "guidelines" if target == "prompt" else "agent code"
    user = (
        f"The environment's instructions to the agent:\n{instructions}\n\n"
        f"The agent's current {what}:\n{current or '(none yet)'}\n\n"
        f"Recent episodes of the agent:\n{digest}\n\n"
        f"{_GOALS[optimization].format(change=change)}\n{answer}"
    )
    system = "You improve AI agents that act in environments through tool calls. Be concrete and brief."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


_PROMPT_RE = re.compile(r"<prompt>\s*(.*?)\s*(?:</prompt>|$)", re.DOTALL | re.IGNORECASE)
_CODE_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def parse_prompt(reply: str) -> tuple[str | None, str]:
    """The guidelines in ``reply`` (the last <prompt> block), or None and why."""
    found = [m.group(1).strip() for m in _PROMPT_RE.finditer(reply)]
    found = [f for f in found if f]
    if not found:
        return None, "unparsed: no <prompt>...</prompt> block"
    return found[-1], ""


def parse_code(reply: str) -> tuple[str | None, str]:
    """The agent module in ``reply`` (the last ```python block that defines act(turn)), or None and why."""
    blocks = [m.group(1) for m in _CODE_RE.finditer(reply) if m.group(1).strip()]
    if not blocks:
        return None, "unparsed: no ```python block"
    problem = ""
    for code in reversed(blocks):
        problem = check_agent_code(code) or ""
        if not problem:
            return code.rstrip() + "\n", ""
    return None, f"invalid code: {problem}"


def _checked_code(code: str) -> tuple[str | None, str]:
    """A structured reply's module (a ```python fence around it tolerated), or None and why."""
    fence = _CODE_RE.search(code)
    code = fence.group(1) if fence else code
    if not code.strip():
        return None, "unparsed: empty code"
    problem = check_agent_code(code)
    return (None, f"invalid code: {problem}") if problem else (code.rstrip() + "\n", "")


async def propose(
    client: Any,
    optimization: str,
    target: str,
    parent: Components,
    trajs: Sequence[Trajectory],
    *,
    k: int,
    step_chars: int,
    count_tokens: Any,
    max_prompt_tokens: int,
    sampling: dict[str, Any],
) -> Proposal:
    """Ask ``client`` (the optimizer role) for a new ``target`` component of ``parent``."""
    instructions = ""
    if trajs and trajs[0].messages and trajs[0].messages[0].role == "system":
        instructions = _cut(trajs[0].messages[0].content, 1500)
    current = parent.prompt if target == "prompt" else (parent.agent_code or DEFAULT_AGENT_CODE)
    messages = optimizer_messages(
        optimization, target, instructions, current, episode_digest(trajs, k, step_chars)
    )
    schema = reply_model(target, int(sampling.get("max_tokens", 512)), max_prompt_tokens)
    structured = await client.structured(messages, schema, **sampling)
    reply = structured.text
    stats = {
        "request_chars": sum(len(m["content"]) for m in messages),
        "reply_chars": len(reply),
        "structured": structured.ok,
    }
    unusable = f" (not a {schema.__name__} object: {structured.error})" if not structured.ok else ""
    if target == "prompt":
        if structured.value is not None:
            text, why = structured.value.prompt.strip() or None, "unparsed: an empty prompt"  # type: ignore[attr-defined]
        else:
            text, why = parse_prompt(reply)
        if text is None:
            return Proposal(None, why + unusable, reply, stats)
        length = count_tokens(text)
        if length > max_prompt_tokens:
            return Proposal(
                None,
                f"too long: the prompt is {length} tokens, the limit is {max_prompt_tokens}",
                reply,
                stats,
            )
        new = parent.model_copy(update={"prompt": text})
    else:
        if structured.value is not None:
            code, why = _checked_code(structured.value.code)  # type: ignore[attr-defined]
        else:
            code, why = parse_code(reply)
        if code is None:
            return Proposal(None, why + unusable, reply, stats)
        new = parent.model_copy(update={"agent_code": code})
    if new == parent:
        return Proposal(None, "unchanged: the reply repeats the current component", reply, stats)
    return Proposal(new, "", reply, stats)
