"""Direct Preference Optimization (Rafailov et al. 2023) on pairs of agent conversations.

A preference pair is a prompt (the conversation so far: system, user, earlier turns) and two
continuations of it, ``chosen`` and ``rejected``, each one or more assistant turns possibly
interleaved with tool results — OpenAI chat messages, one JSON object per line (:func:`read_pairs`).

Both continuations are tokenized the way the agent builds its running sequence
(:class:`~horizonrl.agent.chat.ChatFormat` with the env's tools): the prompt rendered once with the
generation prompt, each assistant turn's text plus the end-of-turn token as model tokens (``loss_mask``
1), and the template's turn suffix and the tool/user observations between turns as context tokens
(mask 0). The records are ordinary :class:`~horizonrl.types.Trajectory` objects, so batching
(``collate``, ``micro_batches``) and log-probabilities (``policy_forward``) are the trainer's own.

A response's log-probability is the sum of its model-token logprobs (their mean with
``dpo.length_normalize``). The reference log-probabilities are computed once, before any update, under
``no_grad``: with a LoRA policy from the model with its adapter switched off (the base model, as TRL
does; a fresh adapter starts equal to it), otherwise from the starting weights themselves — no
second copy of the model is kept. The loss is :func:`horizonrl.algos.losses.dpo`.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from horizonrl.agent.chat import ChatFormat
from horizonrl.agent.parsing import format_tool_call, parse_tool_calls
from horizonrl.algos import losses
from horizonrl.config import DPOConfig
from horizonrl.errors import DataError, TrainingError, iter_user_lines
from horizonrl.tokens import pad_token_id
from horizonrl.train.batching import TokenBatch, collate, micro_batches
from horizonrl.train.constrained import unconstrained
from horizonrl.train.logprobs import MIN_SHARED_PREFIX, common_prompt_prefix, policy_forward, shares_prefix
from horizonrl.train.optim import make_optimizer, optimizer_step
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


# ---------------------------------------------------------------------------------------------------
# sequence log-probabilities


def _pair_micro_batches(model: Any, pairs: Sequence[TokenPair], max_tokens: int) -> list[list[int]]:
    """Pair indices grouped so each micro-batch (both sequences of each pair: 2 rows per pair) stays
    within ``max_tokens`` padded tokens, a prompt prefix every row shares counted once."""
    rows = [t for p in pairs for t in (p.chosen, p.rejected)]
    shared = common_prompt_prefix(rows) if shares_prefix(model) else 0
    if shared < MIN_SHARED_PREFIX or shared >= max_tokens:
        shared = 0
    return micro_batches([p.length - shared for p in pairs], max(1, (max_tokens - shared) // 2))


def _sequence_logps(
    model: Any,
    pairs: Sequence[TokenPair],
    pad_id: int,
    autocast_dtype: torch.dtype | None,
    length_normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen [k], rejected [k])`` log-probabilities of one micro-batch of pairs under ``model``
    (carrying the gradient when enabled): the sum (or mean) of each response's model-token logprobs."""
    batch: TokenBatch = collate(
        unconstrained([p.chosen for p in pairs] + [p.rejected for p in pairs]), pad_id
    )
    logp = policy_forward(model, batch, 1.0, autocast_dtype).logprobs
    bad = (~torch.isfinite(logp.detach())).any(dim=-1).nonzero().flatten().tolist()
    if bad:
        raise TrainingError(
            f"non-finite logprobs for {[batch.ids[i] for i in bad][:5]}: the weights may have diverged"
        )
    mask = batch.loss_mask.to(logp.device)
    seq = (logp * mask).sum(dim=-1)
    if length_normalize:
        seq = seq / mask.sum(dim=-1).clamp(min=1)
    k = len(pairs)
    return seq[:k], seq[k:]


@torch.no_grad()
def score_pairs(
    model: Any,
    pairs: Sequence[TokenPair],
    pad_id: int,
    micro_batch_tokens: int,
    autocast_dtype: torch.dtype | None = None,
    length_normalize: bool = False,
    reference: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen [P], rejected [P])`` log-probabilities of every pair under ``model`` in eval mode,
    without gradients. ``reference``: the reference policy — the model with its LoRA adapter switched
    off, or the model as it is when it has no adapter."""
    chosen = torch.zeros(len(pairs))
    rejected = torch.zeros(len(pairs))
    was_training = model.training
    model.eval()
    off = model.disable_adapter() if reference and hasattr(model, "disable_adapter") else None
    try:
        with off if off is not None else contextlib.nullcontext():
            for rows in _pair_micro_batches(model, pairs, micro_batch_tokens):
                c, r = _sequence_logps(
                    model, [pairs[i] for i in rows], pad_id, autocast_dtype, length_normalize
                )
                chosen[rows] = c.float().cpu()
                rejected[rows] = r.float().cpu()
    finally:
        model.train(was_training)
    return chosen, rejected


def preference_stats(
    policy: tuple[torch.Tensor, torch.Tensor], reference: tuple[torch.Tensor, torch.Tensor], beta: float
) -> dict[str, float]:
    """The DPO loss and reward statistics of scored pairs, plus ``prefers_chosen``: the fraction of
    pairs where the policy gives the chosen response the higher log-probability."""
    loss, stats = losses.dpo(policy[0], policy[1], reference[0], reference[1], beta)
    return {
        "loss": float(loss),
        **stats,
        "prefers_chosen": float((policy[0] > policy[1]).float().mean()),
    }


# ---------------------------------------------------------------------------------------------------
# training


def _batches(n: int, batch_size: int, epochs: int, seed: int) -> Iterator[tuple[int, list[int]]]:
    """(epoch, pair indices) of every optimizer step: each epoch a fresh seeded shuffle."""
    rng = random.Random(seed)
    for epoch in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n, batch_size):
            yield epoch, order[start : start + batch_size]


def _accumulate(
    model: Any,
    pairs: Sequence[TokenPair],
    chunk: list[int],
    reference: tuple[torch.Tensor, torch.Tensor],
    cfg: DPOConfig,
    pad_id: int,
    autocast_dtype: torch.dtype | None,
) -> dict[str, float]:
    """Forward and backward over the pairs ``chunk`` (indices into ``pairs``) in micro-batches; the
    gradients in ``.grad`` add up to the gradient of the chunk's mean DPO loss. Returns the loss and
    pair-weighted means of the stats."""
    chunk_pairs = [pairs[i] for i in chunk]
    totals: dict[str, float] = {"loss": 0.0}
    for rows in _pair_micro_batches(model, chunk_pairs, cfg.micro_batch_tokens):
        idx = [chunk[i] for i in rows]
        names = [pairs[i].id for i in idx][:8]
        chosen, rejected = _sequence_logps(
            model, [pairs[i] for i in idx], pad_id, autocast_dtype, cfg.length_normalize
        )
        ref_chosen, ref_rejected = (r[idx].to(chosen) for r in reference)
        try:
            loss, stats = losses.dpo(chosen, rejected, ref_chosen, ref_rejected, cfg.beta)
        except ValueError as exc:
            raise TrainingError(f"DPO loss of pairs {names}: {exc}") from None
        if not torch.isfinite(loss):
            raise TrainingError(f"non-finite DPO loss ({loss.item()}) for pairs {names}")
        share = len(idx) / len(chunk)
        (loss * share).backward()
        totals["loss"] += float(loss.detach()) * share
        stats["chosen_logp"] = float(chosen.detach().mean())
        stats["rejected_logp"] = float(rejected.detach().mean())
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value * share
    return totals


def train_dpo(
    model: Any,
    pairs: Sequence[TokenPair],
    cfg: DPOConfig,
    pad_id: int,
    seed: int = 0,
    autocast_dtype: torch.dtype | None = None,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[dict[str, float]]:
    """Train ``model``'s trainable parameters with DPO on ``pairs``; one metrics dict per step.

    ``reference``: the pairs' reference log-probabilities (chosen [P], rejected [P]) when already
    computed (see :func:`score_pairs`); otherwise they are computed here, before the first update.
    Each step takes ``cfg.batch_size`` pairs (seeded shuffle per epoch), accumulates the gradient of
    their mean loss over micro-batches of at most ``cfg.micro_batch_tokens`` padded tokens (a pair's
    two sequences always together), then clips and steps; a non-finite loss or gradient stops
    training with the pairs named and the weights untouched."""
    if not pairs:
        raise DataError("DPO needs at least one preference pair")
    optimizer, scheduler = make_optimizer(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps)
    if reference is None:
        reference = score_pairs(
            model, pairs, pad_id, cfg.micro_batch_tokens, autocast_dtype, cfg.length_normalize, True
        )
    if any(r.shape != (len(pairs),) for r in reference):
        raise ValueError(f"reference: expected two tensors of shape ({len(pairs)},)")
    per_epoch = -(-len(pairs) // cfg.batch_size)
    total_steps = per_epoch * cfg.epochs
    history: list[dict[str, float]] = []
    model.train()
    for step, (epoch, chunk) in enumerate(_batches(len(pairs), cfg.batch_size, cfg.epochs, seed), start=1):
        start = time.perf_counter()
        try:
            totals = _accumulate(model, pairs, chunk, reference, cfg, pad_id, autocast_dtype)
        except TrainingError:
            optimizer.zero_grad(set_to_none=True)  # no partial gradient survives into a later step
            raise
        totals["grad_norm"] = optimizer_step(model, optimizer, scheduler, cfg.max_grad_norm)
        totals["lr"] = scheduler.get_last_lr()[0]
        totals["epoch"] = float(epoch)
        totals["pairs"] = float(len(chunk))
        totals["step_s"] = time.perf_counter() - start
        history.append(totals)
        if on_step is not None:
            on_step(step, total_steps, totals)
    model.eval()
    return history


# ---------------------------------------------------------------------------------------------------
# the whole command


def config_pairs(config: Any) -> list[PreferencePair]:
    """The pairs of ``dpo.pairs`` (at most ``dpo.max_pairs``); ConfigError when the key is not set."""
    from horizonrl.errors import ConfigError

    if config.dpo.pairs is None:
        raise ConfigError(
            "dpo.pairs is not set: give the JSONL file of preference pairs, e.g. "
            "`horizon dpo CONFIG dpo.pairs=path/to/pairs.jsonl` (format: docs/dpo.md)"
        )
    return read_pairs(config.dpo.pairs, config.dpo.max_pairs)


def run_dpo(
    config: Any,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    pairs: Sequence[PreferencePair] | None = None,
) -> dict[str, Any]:
    """`horizon dpo`: load the policy (LoRA per ``model.finetune``), read ``dpo.pairs`` (unless
    ``pairs`` are given) and tokenize them with the env's tools, score them under the reference, train,
    score them again, save the adapter (``dpo_adapter/``) or the weights (``dpo_model/``) and
    ``dpo_metrics.jsonl`` (one line per step) and ``dpo_summary.json`` in the run directory. Returns
    the summary."""
    from horizonrl.envs.registry import make_env
    from horizonrl.models import context_length, load_base, make_trainable
    from horizonrl.policy import write_policy

    status = on_status or (lambda text: None)
    cfg: DPOConfig = config.dpo
    wall = time.perf_counter()
    raw = list(pairs) if pairs is not None else config_pairs(config)
    status("loading model")
    loaded = load_base(config.model)
    model, tokenizer = make_trainable(loaded.base, config.model), loaded.tokenizer
    pad = pad_token_id(tokenizer)
    tools = make_env(config.env.name, config.env.options).tools
    encoded = encode_pairs(raw, tokenizer, tools, context_length(model, config.model), config.env.name)
    autocast_dtype = config.train.autocast_dtype
    args = (pad, cfg.micro_batch_tokens, autocast_dtype, cfg.length_normalize)
    status("reference log-probabilities")
    reference = score_pairs(model, encoded, *args, reference=True)
    before = preference_stats(reference, reference, cfg.beta)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / "dpo_metrics.jsonl"
    with metrics_path.open("w", encoding="utf-8") as sink:

        def record(step: int, total: int, stats: dict[str, float]) -> None:
            sink.write(json.dumps({"step": step, **stats}) + "\n")
            sink.flush()
            if on_step is not None:
                on_step(step, total, stats)

        status("training")
        train_start = time.perf_counter()
        history = train_dpo(
            model, encoded, cfg, int(pad), config.seed, autocast_dtype, record, reference=reference
        )
        train_s = time.perf_counter() - train_start
    status("scoring the trained policy")
    after = preference_stats(score_pairs(model, encoded, *args), reference, cfg.beta)
    out = run_dir / ("dpo_adapter" if hasattr(model, "disable_adapter") else "dpo_model")
    if out.exists():
        shutil.rmtree(out)
    write_policy(
        out, model=model, tokenizer=tokenizer, base=loaded.identity, name="dpo", description="horizon dpo"
    )
    summary = {
        "pairs": len(encoded),
        "steps": len(history),
        "epochs": cfg.epochs,
        "beta": cfg.beta,
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "before": before,
        "after": after,
        "saved": str(out),
        "metrics": str(metrics_path),
        "train_s": train_s,
        "wall_s": time.perf_counter() - wall,
    }
    (run_dir / "dpo_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
