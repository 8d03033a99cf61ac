"""Preference pairs of agent conversations: the file format, reading it, and tokenizing a pair the
way the agent builds its running sequence (the data of DPO, :mod:`horizonrl.train.dpo`, and of MALT's
sibling pairs).

A preference pair is a prompt (the conversation so far: system, user, earlier turns) and two
continuations of it, ``chosen`` and ``rejected``, each one or more assistant turns possibly
interleaved with tool results — OpenAI chat messages, one JSON object per line (:func:`read_pairs`).

Both continuations are tokenized the way the agent builds its running sequence
(:class:`~horizonrl.chat.ChatFormat` with the env's tools): the prompt rendered once with the
generation prompt, each assistant turn's text plus the end-of-turn token as model tokens (``loss_mask``
1), and the template's turn suffix and the tool/user observations between turns as context tokens
(mask 0). The records are ordinary :class:`~horizonrl.types.Trajectory` objects, so batching
(``collate``, ``micro_batches``) and log-probabilities (``policy_forward``) are the trainer's own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from horizonrl.chat import ChatFormat
from horizonrl.errors import DataError, iter_user_lines
from horizonrl.toolcalls import format_tool_call, parse_tool_calls
from horizonrl.types import Message, ToolSpec, Trajectory

#: What a line of a preference file must hold (quoted in every data error).
PAIR_FORMAT = (
    'each line must be one JSON object {"id": "optional", "prompt": [messages], "chosen": [messages], '
    '"rejected": [messages]} with OpenAI chat messages {"role": "system"|"user"|"assistant"|"tool", '
    '"content": ...}; chosen and rejected start with an assistant message'
)


# ---------------------------------------------------------------------------------------------------
# data


def _normalize_message(raw: Any) -> Any:
    """OpenAI-format leniency: ``content: null`` (assistant turns with only tool calls) becomes "", and
    a list of content parts becomes their joined text."""
    if not isinstance(raw, dict):
        return raw
    content = raw.get("content", "")
    if content is None:
        content = ""
    elif isinstance(content, list):
        parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in content]
        content = "".join(parts)
    return {**raw, "content": content}


def _normalize_tool(raw: Any) -> Any:
    """A tool in OpenAI ``{"type": "function", "function": {...}}`` shape, or flat ``{name, ...}``."""
    if isinstance(raw, dict) and isinstance(raw.get("function"), dict):
        return raw["function"]
    return raw


class PreferencePair(BaseModel):
    """One line of a preference file: a prompt and a preferred and a dispreferred continuation."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, description="Names the pair in errors (default: file:line).")
    prompt: list[Message] = Field(description="The conversation before the continuations (non-empty).")
    chosen: list[Message] = Field(description="The preferred continuation: starts with an assistant turn.")
    rejected: list[Message] = Field(description="The dispreferred continuation: same shape as chosen.")
    tools: list[ToolSpec] | None = Field(
        None, description="Tools the prompt offers (OpenAI 'tools' format); default: the config's env's."
    )

    @field_validator("prompt", "chosen", "rejected", mode="before")
    @classmethod
    def _messages(cls, value: Any) -> Any:
        return [_normalize_message(m) for m in value] if isinstance(value, list) else value

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, value: Any) -> Any:
        return [_normalize_tool(t) for t in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _check_shape(self) -> PreferencePair:
        if not self.prompt:
            raise ValueError("prompt is empty: it needs at least the user message")
        for side in ("chosen", "rejected"):
            messages: list[Message] = getattr(self, side)
            if not messages:
                raise ValueError(f"{side} is empty: it needs at least one assistant message")
            if not any(m.role == "assistant" for m in messages):
                roles = ", ".join(m.role for m in messages)
                raise ValueError(
                    f"{side} has no assistant message (roles: {roles}); there is nothing to train on"
                )
            if messages[0].role != "assistant":
                raise ValueError(
                    f"{side} starts with a {messages[0].role!r} message; a continuation starts with the "
                    "assistant's reply to the prompt (move earlier messages into prompt)"
                )
        return self


def read_pairs(path: str | Path, limit: int | None = None) -> list[PreferencePair]:
    """The preference pairs of a JSONL file (at most ``limit``). A bad line raises DataError naming the
    file, the line, what is wrong and what a valid line looks like; so do an empty file and duplicate
    ids."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"preference file {str(path)!r} does not exist ({PAIR_FORMAT})")
    pairs: list[PreferencePair] = []
    seen: dict[str, int] = {}
    for lineno, line in iter_user_lines(path, "preference file"):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); {PAIR_FORMAT}"
            ) from None
        if not isinstance(data, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(data).__name__}; {PAIR_FORMAT}")
        try:
            pair = PreferencePair.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "(line)"
            msg = str(first["msg"]).removeprefix("Value error, ")
            raise DataError(f"{where}: not a valid preference pair: {loc}: {msg}; {PAIR_FORMAT}") from None
        if pair.id is None:
            pair.id = f"{path.name}:{lineno}"
        if pair.id in seen:
            raise DataError(f"{where}: pair id {pair.id!r} was already used on line {seen[pair.id]}")
        seen[pair.id] = lineno
        pairs.append(pair)
        if limit is not None and len(pairs) >= limit:
            break
    if not pairs:
        raise DataError(f"preference file {str(path)!r} holds no pairs; {PAIR_FORMAT}")
    return pairs


# ---------------------------------------------------------------------------------------------------
# tokenization


def _assistant_text(message: Message) -> str:
    """What the model wrote: the content, which holds the tool-call markup for agent records. Calls
    given only in ``tool_calls`` (other OpenAI-format sources) are written out in the agent's format."""
    if not message.tool_calls or parse_tool_calls(message.content).calls:
        return message.content
    calls = "\n".join(format_tool_call(c.name, c.arguments) for c in message.tool_calls)
    return f"{message.content}\n{calls}" if message.content else calls


def encode_continuation(
    chat: ChatFormat, prompt: Sequence[Message], continuation: Sequence[Message]
) -> tuple[list[int], list[int], list[int]]:
    """``(prompt_ids, response_ids, loss_mask)`` of ``prompt`` followed by ``continuation``, built as
    the agent loop builds a trajectory: the prompt with the generation prompt; per assistant turn its
    text and the end-of-turn token (mask 1) then the rest of the template's turn suffix (mask 0); the
    messages between assistant turns as observation tokens (mask 0). Messages after the last
    assistant turn carry no loss and are left out."""
    prompt_ids = chat.prompt_ids(list(prompt))
    end_of_turn = [chat.end_of_turn]
    response: list[int] = []
    mask: list[int] = []
    observations: list[Message] = []
    for message in continuation:
        if message.role != "assistant":
            observations.append(message)
            continue
        if observations:
            ids = chat.observation_ids(observations)
            response += ids
            mask += [0] * len(ids)
            observations = []
        generated = chat.encode(_assistant_text(message)) + end_of_turn
        closing = chat.close_turn_ids(generated)
        response += generated + closing
        mask += [1] * len(generated) + [0] * len(closing)
    return prompt_ids, response, mask


@dataclass
class TokenPair:
    """A preference pair as two trajectory records over the same prompt."""

    id: str
    chosen: Trajectory
    rejected: Trajectory

    @property
    def length(self) -> int:
        """Tokens of the longer of the two sequences."""
        return max(_length(self.chosen), _length(self.rejected))


def _length(traj: Trajectory) -> int:
    return len(traj.prompt_ids) + len(traj.response_ids)


def encode_pairs(
    pairs: Sequence[PreferencePair],
    tokenizer: Any,
    tools: Sequence[ToolSpec] = (),
    max_tokens: int | None = None,
    env: str = "dpo",
) -> list[TokenPair]:
    """Tokenize ``pairs`` with the agent's chat format (``tools``: the env's tools, unless a pair
    names its own). A pair longer than ``max_tokens`` (the model's context) or whose two continuations
    are the same tokens raises DataError naming it."""
    formats: dict[str, ChatFormat] = {}
    out: list[TokenPair] = []
    for pair in pairs:
        pair_tools = list(pair.tools) if pair.tools is not None else list(tools)
        key = json.dumps([t.model_dump() for t in pair_tools], sort_keys=True)
        if key not in formats:
            formats[key] = ChatFormat(tokenizer, pair_tools)
        chat = formats[key]
        pid = str(pair.id)
        records = []
        for side in ("chosen", "rejected"):
            continuation: list[Message] = getattr(pair, side)
            prompt_ids, response_ids, mask = encode_continuation(chat, pair.prompt, continuation)
            if max_tokens is not None and len(prompt_ids) + len(response_ids) > max_tokens:
                raise DataError(
                    f"pair {pid!r}: prompt + {side} is {len(prompt_ids) + len(response_ids)} tokens, "
                    f"more than the model's context of {max_tokens}"
                )
            records.append(
                Trajectory(
                    id=f"{pid}/{side}",
                    task_id=pid,
                    group_id=pid,
                    env=env,
                    messages=[*pair.prompt, *continuation],
                    prompt_ids=prompt_ids,
                    response_ids=response_ids,
                    loss_mask=mask,
                    logprobs=[0.0] * len(response_ids),
                    num_turns=sum(m.role == "assistant" for m in continuation),
                    finish="finished",
                )
            )
        chosen, rejected = records
        if (chosen.response_ids, chosen.loss_mask) == (rejected.response_ids, rejected.loss_mask):
            raise DataError(f"pair {pid!r}: chosen and rejected are the same tokens; nothing to prefer")
        out.append(TokenPair(pid, chosen, rejected))
    return out
