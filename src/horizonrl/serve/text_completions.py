"""Text completions (``/v1/completions``) on the served engine: raw prompts (text or token ids, no
chat template), each choice one call of the engine's ``generate``, with vLLM's extras (token ids
back, logprobs keyed by token id, ``structured_outputs``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.constraints import ConstraintError
from horizonrl.seeds import derive_seed
from horizonrl.serve.admission import ServedEngine
from horizonrl.serve.protocol import (
    CompletionLogprobs,
    CompletionRequest,
    TextChoice,
    TextCompletion,
    Usage,
    bad_request,
)
from horizonrl.serve.structured import constraint_error, from_structured_outputs


async def complete(served: ServedEngine, req: CompletionRequest) -> TextCompletion:
    """A text completion of raw prompts (no chat template)."""
    req.check_neutral()
    adapter = served.check_model(req.model)
    constraint = from_structured_outputs(req.structured_outputs)
    prompts = []
    for p in req.prompts():
        ids = (
            list(served.tokenizer(p, add_special_tokens=False)["input_ids"])
            if isinstance(p, str)
            else list(p)
        )
        if not ids:
            raise bad_request("'prompt' must not be empty", param="prompt")
        if min(ids) < 0 or max(ids) >= served.engine.vocab_size:
            raise bad_request(f"prompt token ids must lie in [0, {served.engine.vocab_size})", param="prompt")
        prompts.append(ids)
    jobs = []
    for p_index, ids in enumerate(prompts):
        limit = served.completion_limit(len(ids), req.max_tokens, "prompt")
        for i in range(req.n):
            seed = None if req.seed is None else derive_seed(req.seed, p_index, i)
            params = SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                max_new_tokens=limit,
                stop=req.stops,
                seed=seed,
                top_logprobs=req.logprobs or 0,
                constraint=constraint,
            )
            jobs.append((ids, params))
    await served.admit(len(jobs), adapter)
    try:
        completions = await asyncio.gather(*(served.generate(ids, params, adapter) for ids, params in jobs))
    except ConstraintError as exc:
        raise constraint_error(exc, "structured_outputs") from None
    finally:
        served.release(len(jobs), adapter)
    choices = []
    eos = set(served.engine.eos_token_ids)
    for index, completion in enumerate(completions):
        ids = [t for t in completion.token_ids]
        shown = ids[:-1] if ids and ids[-1] in eos else ids
        text = served.tokenizer.decode(shown, skip_special_tokens=False)
        choices.append(
            TextChoice(
                index=index,
                text=text,
                logprobs=_text_logprobs(
                    served.tokenizer, completion, req.logprobs, req.return_tokens_as_token_ids
                )
                if req.logprobs is not None
                else None,
                finish_reason=completion.finish_reason,
                token_ids=list(completion.token_ids) if req.return_token_ids else None,
            )
        )
    prompt_tokens = sum(len(ids) for ids in prompts)
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return TextCompletion(
        id=f"cmpl-{uuid.uuid4().hex[:24]}",
        created=int(time.time()),
        model=req.model,  # the base model's name or the adapter's
        system_fingerprint=f"horizonrl-w{served.policy_version}",
        choices=choices,
        usage=Usage.counted(prompt_tokens, completion_tokens),
    )


def _text_logprobs(
    tokenizer: Any, completion: Completion, top: int, as_ids: bool = False
) -> CompletionLogprobs:
    if as_ids:  # vLLM's form, for clients that need the exact tokens
        tokens = [f"token_id:{t}" for t in completion.token_ids]
    else:
        tokens = [tokenizer.decode([t]) for t in completion.token_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    tops = None
    if top and completion.top_logprobs is not None:
        tops = [{tokenizer.decode([i]): v for i, v in row[:top]} for row in completion.top_logprobs]
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=list(completion.logprobs), top_logprobs=tops, text_offset=offsets
    )
