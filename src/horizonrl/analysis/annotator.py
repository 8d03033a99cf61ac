"""The annotator role: reads a trace and answers, per MAST mode, yes or no with the steps and role
where it happens and a one-line reason.

Long traces are split into overlapping windows of steps (each window shows the task and the steps
with their global indices, so every verdict names steps of the whole trace); a mode found in any
window is present, with the steps of every window that found it. Replies are parsed tolerantly —
``1.3: yes | steps 4, 5 | role solver | reason ...``, ``1.3 - Yes (step 4) ...`` or a JSON object —
and a line naming no known mode, or a mode with no yes/no, is counted as unparsed, never raised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from horizonrl.analysis.detectors import Verdict
from horizonrl.analysis.mast import MODE_IDS, MODES
from horizonrl.analysis.trace import Step, Trace
from horizonrl.types import Message

SYSTEM = (
    "You annotate failures of LLM agents with the MAST taxonomy. You are shown a task and numbered "
    "steps of an episode (each step: the role that took it, what it wrote, the tool calls it made and "
    "what they returned). For every failure mode below, decide whether it happens in these steps.\n\n"
    "{modes}\n\n"
    "Answer with exactly one line per mode, in this form:\n"
    "<id>: yes|no | steps <comma-separated step numbers> | role <role> | reason <one short sentence>\n"
    "For 'no' write only '<id>: no'. Use only the ids listed."
)


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
        return None
    if not isinstance(data, dict):
        return None
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
        answer = _YES.match(rest)
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
    unparsed: int
    unanswered: list[str]  # modes no window answered


async def annotate(
    trace: Trace, client: Any, window_steps: int = 12, overlap: int = 2, max_tokens: int = 400
) -> Annotation:
    """The annotator role's verdicts on ``trace`` (``client``: a RoleClient)."""
    parts: list[Parsed] = []
    spans = windows(len(trace.steps), window_steps, overlap)
    for start, end in spans:
        reply = await client.chat(prompt(trace, start, end), temperature=0.0, max_tokens=max_tokens)
        parts.append(parse_reply(reply, set(range(start, end))))
    verdicts = merge(parts)
    return Annotation(
        verdicts,
        len(spans),
        sum(p.unparsed for p in parts),
        [m for m in MODE_IDS if m not in verdicts],
    )
