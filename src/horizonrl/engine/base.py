"""The Engine contract: token-in / token-out generation.

Callers send one prompt at a time and ``await`` its completion; the engine batches concurrent
requests itself, so agent code never builds batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.engine.constraints import Constraint


class SamplingParams(BaseModel):
    """How to sample one completion. ``temperature == 0`` means greedy decoding."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature; 0 decodes greedily.")
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling: keep the smallest token set whose probability reaches top_p.",
    )
    max_new_tokens: int = Field(256, ge=1, le=131_072, description="Most tokens to generate for one turn.")
    stop: tuple[str, ...] = Field((), description="Strings that end the completion (kept in the output).")
    seed: int | None = Field(
        None, ge=-(2**63), le=2**63 - 1, description="Per-request sampling seed, for reproducible samples."
    )
    top_logprobs: int = Field(
        0,
        ge=0,
        le=20,
        description="Also return this many most likely tokens and their log-probabilities at each "
        "position (under the distribution the token was sampled from; 0: none).",
    )
    constraint: Constraint | None = Field(
        None,
        description="Hold the completion to a JSON schema, regex, grammar, choice or tool calls "
        "(enforced per row by the engine; the logprobs are then under the masked distribution).",
    )


FinishReasonT = Literal["stop", "length"]


class Completion(BaseModel):
    """A generated continuation: its tokens, their sampling log-probabilities and why it ended.

    ``finish_reason`` is "stop" when an end-of-sequence token or a stop string ended it (the token
    is included in ``token_ids``), "length" when ``max_new_tokens`` ran out. ``top_logprobs`` (when
    asked for) holds per position the most likely ``(token id, logprob)`` pairs, most likely first.
    ``weights_version`` is the version of the weights it was sampled from (the engine counts its
    weight updates; every token of a completion comes from one version). ``constraint_met`` is None
    for an unconstrained request, else whether the text is a complete sentence of the constraint's
    language (False: ``max_new_tokens`` or a stop string cut it off first).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReasonT
    top_logprobs: list[list[tuple[int, float]]] | None = None
    weights_version: int = 0
    constraint_met: bool | None = None


@runtime_checkable
class Engine(Protocol):
    """Token-in / token-out generation shared by concurrent agents."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """Generate a continuation of ``prompt_ids``; concurrent calls are batched by the engine."""
        ...

    def update_weights(self, policy: Any, stages: Sequence[Any] = ()) -> None:
        """Make the engine sample from ``policy``'s current weights (after an optimizer step).
        ``stages`` are the LoRA adapters already merged into ``policy``'s base, in order
        (:class:`horizonrl.policy.AdapterStage`; the SFT adapter of a warm-started run): an engine
        that ships weights as one adapter over the original base needs them
        (:mod:`horizonrl.engine.weight_sync`); one that copies the whole policy ignores them."""
        ...

    # An engine may also expose ``eos_token_ids: frozenset[int]``, the ids that end a row
    # (:func:`horizonrl.tokens.eos_token_ids`); the agent's chat format then strips the same ids.


def serves_adapters(engine: Any) -> bool:
    """Whether ``engine`` serves LoRA adapters per row (``add_adapter``). An engine that has the
    method but cannot use it says so in a ``serves_adapters`` attribute (the int8 sampling copy)."""
    return callable(getattr(engine, "add_adapter", None)) and bool(getattr(engine, "serves_adapters", True))
