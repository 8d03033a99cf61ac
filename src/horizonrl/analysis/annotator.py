"""The annotator role: reads a trace and answers, per MAST mode, yes or no with the steps and role
where it happens and a one-line reason.

Long traces are split into overlapping windows of steps (each window shows the task and the steps
with their global indices, so every verdict names steps of the whole trace); a mode found in any
window is present, with the steps of every window that found it.

The reply is structured (:meth:`RoleClient.structured`, :func:`verdicts_model`): a JSON object with
one key per mode id, each ``{"present": false}`` or ``{"present": true, "steps": [...], "role": ...,
"reason": ...}``, the steps those the window shows and the role one of the trace's. On the policy and
local backends the engine holds the reply to that schema, on openai it is sent as
``response_format``. A reply that is not a valid object (``structured: parse``, a reply cut off by
``max_tokens``) is counted (``unusable``) and its text parsed tolerantly (:func:`parse_reply`) —
``1.3: yes | steps 4, 5 | role solver | reason ...``, ``1.3 - Yes (step 4) ...``, a JSON object, the
complete verdicts of a cut-off one — and a line naming no known mode, or a mode with no yes/no, is
counted as unparsed, never raised.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from horizonrl.analysis.detectors import Verdict
from horizonrl.analysis.mast import MODE_IDS, MODES
from horizonrl.analysis.trace import Step, Trace
from horizonrl.types import Message

SYSTEM = (
    "You annotate failures of LLM agents with the MAST taxonomy. You are shown a task and numbered "
    "steps of an episode (each step: the role that took it, what it wrote, the tool calls it made and "
    "what they returned). For every failure mode below, decide whether it happens in these steps.\n\n"
    "{modes}\n\n"
    "Answer with a JSON object that has one key per mode id above, in order. The value of a mode that "
    'does not happen in these steps is {{"present": false}}; of one that happens, {{"present": true, '
    '"steps": [<the step numbers where it happens>], "role": "<the role that did it>", "reason": '
    '"<one short sentence>"}}.'
)

#: bounds of a found mode in the structured reply: its steps, its reason's characters
MAX_STEPS = 6
REASON_CHARS = 60


class Absent(BaseModel):
    """A mode that does not happen in the window."""

    model_config = ConfigDict(extra="forbid")
    present: Literal[False]


@lru_cache(maxsize=256)
def verdicts_model(start: int, end: int, roles: tuple[str, ...]) -> type[BaseModel]:
    """The annotator's reply for the window of steps ``[start, end)`` of a trace with ``roles``: an
    object with exactly one key per mode id, each :class:`Absent` or a found mode whose steps are
    steps of the window (at most :data:`MAX_STEPS`), whose role is one of ``roles`` and whose reason
    is at most :data:`REASON_CHARS` characters (read back by :func:`structured_verdicts`)."""
    step: Any = Annotated[int, Field(ge=start, le=end - 1)] if end > start else int
    role: Any = Literal[roles] if roles else Annotated[str, Field(min_length=1, max_length=40)]
    found = create_model(
        f"Found_{start}_{end}",
        __config__=ConfigDict(extra="forbid"),
        present=(Literal[True], ...),
        steps=(list[step], Field(max_length=min(MAX_STEPS, max(end - start, 0)))),
        role=(role, ...),
        reason=(str, Field(max_length=REASON_CHARS)),
    )
    fields: dict[str, Any] = {
        "m" + mode.replace(".", "_"): (Absent | found, Field(alias=mode)) for mode in MODE_IDS
    }
    return create_model("ModeVerdicts", __config__=ConfigDict(extra="forbid"), **fields)


def verdicts_budget(start: int, end: int, roles: tuple[str, ...]) -> int:
    """The most tokens a reply at the bounds of :func:`verdicts_model` takes: every mode found, with
    its most steps (a token per digit and comma), its longest role and its longest reason, at a
    token per character (a small model's reason can be "1.1.1.1…", and SmolLM2 writes every digit
    as a token of its own)."""
    steps = min(MAX_STEPS, max(end - start, 0)) * (len(str(max(end - 1, 0))) + 1)
    role = max((len(r) for r in roles), default=40)
    found = 22 + steps + role + REASON_CHARS  # 22: '"1.1":{"present":true,"steps":[],...},'
    return 8 + len(MODE_IDS) * found


def structured_verdicts(value: BaseModel) -> Parsed:
    """The verdicts of a valid :func:`verdicts_model` reply."""
    out = Parsed()
    for mode in MODE_IDS:
        item = getattr(value, "m" + mode.replace(".", "_"))
        present = bool(item.present)
        out.verdicts[mode] = Verdict(
            mode=mode,
            present=present,
            steps=sorted(set(item.steps)) if present else [],
            role=item.role if present else None,
            reason=item.reason.strip() if present else "",
            source="judge",
        )
    return out


def mode_list() -> str:
    return "\n".join(f"{m.id} {m.name}: {m.definition}" for m in MODES)


def windows(n_steps: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """``[start, end)`` step ranges of at most ``size`` steps, consecutive ones sharing ``overlap``."""
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"window size must be >= 1 and overlap in [0, size), got {size}, {overlap}")
    if n_steps <= size:
        return [(0, n_steps)]
    out, start = [], 0
    while True:
        end = min(start + size, n_steps)
        out.append((start, end))
        if end == n_steps:
            return out
        start = end - overlap


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit // 2] + " […] " + text[-limit // 2 :]


def render_step(step: Step, limit: int = 600) -> str:
    lines = [f"[step {step.index} · {step.role}] {_clip(step.text.strip(), limit)}"]
    for name, args in step.tool_calls:
        lines.append(f"  call {name}({_clip(args, 200)})")
    if step.observation:
        lines.append(f"  returned: {_clip(step.observation.strip(), 300)}")
    return "\n".join(lines)


def prompt(trace: Trace, start: int, end: int, step_chars: int = 600) -> list[Message]:
    steps = "\n".join(render_step(s, step_chars) for s in trace.steps[start:end])
    where = f"steps {start}-{end - 1} of {len(trace.steps)}" if trace.steps else "no steps"
    outcome = f"finish: {trace.finish}; solved: {'yes' if trace.success else 'no'}"
    user = (
        f"Task:\n{_clip(trace.task, 1500)}\n\nRoles: {', '.join(trace.roles)}\n"
        f"Episode ({where}; {outcome}):\n{steps}"
    )
    return [
        Message(role="system", content=SYSTEM.format(modes=mode_list())),
        Message(role="user", content=user),
    ]


@dataclass
class Parsed:
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    unparsed: int = 0


_LINE = re.compile(r"^\W*(\d+\.\d+)\b[^A-Za-z0-9]*(.*)$")
_YES = re.compile(r"^\s*(yes|no|true|false|present|absent|y|n)\b", re.IGNORECASE)
# the line of a JSON verdict that did not parse as JSON: '"1.3": {"present": true, ...'
_JSON_YES = re.compile(r'^\s*present"?\s*:\s*"?(true|false|yes|no)\b', re.IGNORECASE)


def _verdict_from(mode: str, present: bool, rest: str, known_steps: set[int]) -> Verdict:
    steps_part = re.search(r"steps?\s*[:=]?\s*([\d,\s\-and]+)", rest, re.IGNORECASE)
    steps = (
        sorted({int(s) for s in re.findall(r"\d+", steps_part.group(1))} & known_steps) if steps_part else []
    )
    role = re.search(r"role\s*[:=]?\s*([A-Za-z_][\w-]*)", rest, re.IGNORECASE)
    reason = re.search(r"reason\s*[:=]?\s*(.+)$", rest, re.IGNORECASE)
    text = reason.group(1) if reason else re.sub(r"^\W+", "", rest)
    return Verdict(
        mode=mode,
        present=present,
        steps=steps if present else [],
        role=role.group(1) if role and present else None,
        reason=text.strip()[:200] if present else "",
        source="judge",
    )


def _from_json(text: str, known_steps: set[int]) -> Parsed | None:
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if not match:
        return None
    try:
        data = json.loads(match.group(0))
    except ValueError:
        return _from_cut_json(text, known_steps)
    if not isinstance(data, dict):
        return None
    return _verdicts_of(data, known_steps)


_KEY = re.compile(r'"(\d+\.\d+)"\s*:\s*(?=\{)')


def _from_cut_json(text: str, known_steps: set[int]) -> Parsed | None:
    """The complete ``"<id>": {...}`` verdicts of a JSON object cut off before its end."""
    decoder = json.JSONDecoder()
    data: dict[str, Any] = {}
    for match in _KEY.finditer(text):
        try:
            value, _ = decoder.raw_decode(text[match.end() :])
        except ValueError:
            continue
        data.setdefault(match.group(1), value)
    return _verdicts_of(data, known_steps) if data else None


def _verdicts_of(data: dict[str, Any], known_steps: set[int]) -> Parsed:
    out = Parsed()
    for key, value in data.items():
        if key not in MODE_IDS:
            out.unparsed += 1
            continue
        item = value if isinstance(value, dict) else {"present": value}
        present = item.get("present", item.get("answer"))
        if isinstance(present, str):
            present = present.strip().lower() in ("yes", "true", "present", "y")
        if not isinstance(present, bool):
            out.unparsed += 1
            continue
        steps = [int(s) for s in item.get("steps", []) if isinstance(s, int | str) and str(s).isdigit()]
        out.verdicts[key] = Verdict(
            mode=key,
            present=present,
            steps=sorted(set(steps) & known_steps) if present else [],
            role=item.get("role") if present else None,
            reason=str(item.get("reason", ""))[:200] if present else "",
            source="judge",
        )
    return out


def parse_reply(text: str, known_steps: set[int] | None = None) -> Parsed:
    """The verdicts in an annotator's reply (see the module doc); ``known_steps``: the step numbers
    the window showed (others are dropped)."""
    known = known_steps if known_steps is not None else set(range(10_000))
    as_json = _from_json(text, known) if text.lstrip().startswith(("{", "```")) else None
    if as_json is not None:
        return as_json
    out = Parsed()
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _LINE.match(line.strip())
        if not match:
            continue  # prose around the answer lines is not a parse failure
        mode, rest = match.group(1), match.group(2)
        answer = _JSON_YES.match(rest) or _YES.match(rest)
        if mode not in MODE_IDS or answer is None:
            out.unparsed += 1
            continue
        present = answer.group(1).lower() in ("yes", "true", "present", "y")
        if mode not in out.verdicts or present:  # a repeated line may only add a finding
            out.verdicts[mode] = _verdict_from(mode, present, rest[answer.end() :], known)
    return out


def merge(parts: list[Parsed]) -> dict[str, Verdict]:
    """One verdict per mode answered in any window: present when any window found it (its steps the
    union of those windows', its role and reason the first finder's)."""
    merged: dict[str, Verdict] = {}
    for part in parts:
        for mode, verdict in part.verdicts.items():
            have = merged.get(mode)
            if have is None or (verdict.present and not have.present):
                merged[mode] = verdict.model_copy()
            elif verdict.present and have.present:
                have.steps = sorted(set(have.steps) | set(verdict.steps))
    return merged


@dataclass
class Annotation:
    verdicts: dict[str, Verdict]
    windows: int
    unparsed: int  # lines of unusable replies that named no known mode or gave no yes/no
    unanswered: list[str]  # modes no window answered
    unusable: int = 0  # windows whose reply was not the structured object (its text was parsed)


async def annotate(
    trace: Trace, client: Any, window_steps: int = 12, overlap: int = 2, max_tokens: int | None = None
) -> Annotation:
    """The annotator role's verdicts on ``trace`` (``client``: a RoleClient; the windows are asked
    at once, so an engine batches them). ``max_tokens``: per window; by default the most a reply
    at the schema's bounds takes (:func:`verdicts_budget`, ~1,500 tokens for 12 steps), so an
    enforced reply is not cut off — a typical one is far shorter."""
    parts: list[Parsed] = []
    unusable = 0
    spans = windows(len(trace.steps), window_steps, overlap)
    roles = tuple(dict.fromkeys(trace.roles))
    replies = await asyncio.gather(
        *(
            client.structured(
                prompt(trace, start, end),
                verdicts_model(start, end, roles),
                temperature=0.0,
                max_tokens=max_tokens or verdicts_budget(start, end, roles),
            )
            for start, end in spans
        )
    )
    for (start, end), reply in zip(spans, replies, strict=True):
        if reply.value is not None:
            parts.append(structured_verdicts(reply.value))
        else:
            unusable += 1
            parts.append(parse_reply(reply.text, set(range(start, end))))
    verdicts = merge(parts)
    return Annotation(
        verdicts,
        len(spans),
        sum(p.unparsed for p in parts),
        [m for m in MODE_IDS if m not in verdicts],
        unusable,
    )
