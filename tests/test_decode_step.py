"""The engine's written-out decode step (horizonrl.engine.decode_step): for a Llama-style model, plain
and as the fast copies, the engine decodes with it and samples exactly what decoding through the
model's ``forward`` samples; models it does not cover decode through ``forward``."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from horizonrl.engine import decode_step, fast_copy
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.fast_copy import fast_sampler_model
from horizonrl.engine.hf import HFEngine
from horizonrl.models import tiny_random_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model()


def _prompts(tokenizer) -> list[list[int]]:
    texts = [f"Question {i}: " + "how many apples " * (1 + 7 * (i % 3)) + "are there?" for i in range(5)]
    return [tokenizer.encode(t) for t in texts]


async def _decode(engine: HFEngine, prompts: list[list[int]]) -> list:
    """The prompts decoded in one batch, each with its own seed and length (rows leave the batch as
    they finish)."""
    params = [SamplingParams(temperature=0.9, max_new_tokens=10 + 3 * i, seed=i) for i in range(len(prompts))]
    return await asyncio.gather(*(engine.generate(p, q) for p, q in zip(prompts, params, strict=True)))


@pytest.mark.parametrize("kind", ["float32", "int8", "float16"])
def test_the_written_step_samples_what_forward_samples(tiny, kind, monkeypatch):
    model, tokenizer = tiny
    if kind == "float16" and fast_copy.kernel_unavailable(kind):
        pytest.skip(f"float16 weights need fbgemm: {fast_copy.kernel_unavailable(kind)}")
    monkeypatch.setattr(fast_copy, "cpu_int8_dot_products", lambda: True)  # the arithmetic, not the speed
    sampler = copy.deepcopy(model) if kind == "float32" else fast_sampler_model(model, tokenizer, kind)
    step = decode_step.decode_step_for(sampler)
    assert (step.packed_layers is not None) == (kind != "float32")  # packed: the fused layer functions
    written = HFEngine(sampler, tokenizer)
    through_forward = HFEngine(copy.deepcopy(sampler), tokenizer)
    through_forward.decoder.written_decode_step = False
    calls = {"written": 0}
    real_call = decode_step.LlamaDecodeStep.__call__

    def counted(self, *args):
        calls["written"] += 1
        return real_call(self, *args)

    monkeypatch.setattr(decode_step.LlamaDecodeStep, "__call__", counted)
    prompts = _prompts(tokenizer)
    a = asyncio.run(_decode(written, prompts))
    steps_written = calls["written"]
    b = asyncio.run(_decode(through_forward, prompts))
    assert steps_written > 10 and calls["written"] == steps_written  # only the first engine used it
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


def test_models_it_does_not_cover_decode_through_forward(tiny):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    model, _ = tiny
    assert decode_step.unsupported(model) is None
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"]))
    assert "PEFT" in decode_step.unsupported(lora)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert "gpt2" in decode_step.unsupported(gpt2)
    windowed = copy.deepcopy(model)
    windowed.config.model_type, windowed.config.sliding_window = "mistral", 8
    assert "sliding" in decode_step.unsupported(windowed)
    assert decode_step.decode_step_for(gpt2) is None and decode_step.decode_step_for(lora) is None
