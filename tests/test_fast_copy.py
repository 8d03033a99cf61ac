"""The fast sampling copies (``engine.dtype: int8``, ``float16``) on the tiny random Llama: what the
engine promises in every dtype (token ids, the sampled model's own logprobs, per-request seeds)
holds, an int8 row does not depend on what shares its batch, a weight update requantizes or
repacks the policy's weights, and what a copy cannot do is refused in one line."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from horizonrl.engine import fast_copy
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.config import EngineConfig
from horizonrl.engine.factory import engine_from_config
from horizonrl.engine.fast_copy import PackedLinear, fast_sampler_model, kv_cache_dtype
from horizonrl.engine.weights import sampler_model
from horizonrl.errors import ConfigError
from horizonrl.hardware import cpu_bfloat16_matmuls
from horizonrl.model_config import ModelConfig
from horizonrl.models import load_base

MODEL = ModelConfig(path="tiny-random", dtype="float32")


@pytest.fixture(scope="module")
def base() -> object:
    return load_base(MODEL)


@pytest.fixture(autouse=True)
def int8_dot_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the int8 copy's arithmetic on the tiny model, whose speed does not matter:
    it is built on a CPU without int8 dot products too (where a run refuses it, tested below)."""
    monkeypatch.setattr(fast_copy, "cpu_int8_dot_products", lambda: True)


def _engine(base: object) -> object:
    return engine_from_config(base.base, base.tokenizer, EngineConfig(dtype="int8"), MODEL, 0)  # type: ignore[attr-defined]


def test_int8_rows_keep_their_logprobs_and_seeds_whatever_shares_the_batch(base: object) -> None:
    from horizonrl.engine.hf import HFEngine

    built = _engine(base).model  # as engine.dtype=int8 builds it
    assert isinstance(built.lm_head, PackedLinear) and isinstance(
        built.model.layers[0].mlp.down_proj, PackedLinear
    )
    assert built.lm_head.group.qweight.dtype == torch.int8
    assert built.model.embed_tokens.weight.dtype == torch.float32  # norms, attention
    engine = HFEngine(built, base.tokenizer)  # type: ignore[attr-defined]
    # the KV cache: bfloat16 where the CPU multiplies it through oneDNN, else float32
    kept = torch.bfloat16 if cpu_bfloat16_matmuls() else None
    assert engine.decoder.kv_dtype == kv_cache_dtype(built) == kept
    model = built
    tok = base.tokenizer  # type: ignore[attr-defined]
    prompts = [tok.encode(t) for t in ("Hello there", "Write a function that adds two numbers", "2 + 2 =")]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=7)

    async def alone() -> object:
        return await engine.generate(prompts[0], params)

    async def crowded() -> list[object]:
        others = [engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=9)) for p in prompts[1:]]
        return await asyncio.gather(engine.generate(prompts[0], params), *others)

    one = asyncio.run(alone())
    many = asyncio.run(crowded())
    assert one.token_ids == many[0].token_ids and one.logprobs == many[0].logprobs
    # the logprobs are the int8 model's own: teacher-forced through the engine's model (which keeps
    # keys and values in float32; with the bfloat16 cache the engine samples from a slightly
    # different distribution, which sampler_kl measures)
    engine.decoder.kv_dtype = None
    one = asyncio.run(alone())
    ids = torch.tensor([prompts[0] + one.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    n = len(prompts[0])
    forced = [float(logp[n - 1 + i, t]) for i, t in enumerate(one.token_ids)]
    assert forced == pytest.approx(one.logprobs, abs=1e-4)


def test_int8_weight_update_requantizes_the_policy(base: object) -> None:
    from horizonrl.trainable import build_policy

    engine = _engine(base)
    ids = torch.tensor([base.tokenizer.encode("The weights change after every optimizer step.")])  # type: ignore[attr-defined]

    def logits() -> torch.Tensor:
        with torch.no_grad():
            return engine.model(ids).logits.float()

    before = logits()
    policy = build_policy(load_base(MODEL).base, MODEL).model
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.3)
    with torch.no_grad():
        merged = policy(ids).logits.float()
        plain = base.base(ids).logits.float()  # type: ignore[attr-defined]
    engine.update_weights(policy)
    after = logits()
    assert (after - merged).abs().mean() < 0.2 * (after - plain).abs().mean()  # the policy's weights now
    engine.update_weights(base.base)  # type: ignore[attr-defined]
    assert torch.equal(logits(), before)  # requantizing the same weights gives the same model


def test_int8_refuses_what_it_cannot_do_in_one_line(base: object, tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    engine = _engine(base)
    assert engine.serves_adapters is False
    with pytest.raises(ValueError, match="serves no per-row LoRA adapters"):
        engine.add_adapter("ceo", tmp_path)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64))
    with pytest.raises(
        ConfigError, match=r"supports Llama-style decoders .* not GPT2LMHeadModel; use engine.dtype"
    ):
        fast_sampler_model(gpt2, base.tokenizer)  # type: ignore[attr-defined]
    (tmp_path / "ceo").mkdir()  # a role's adapter for the team's engine: refused before it loads
    from horizonrl.config import load_config
    from horizonrl.multiagent.run import open_engine

    config = load_config("configs/humaneval_team.yaml", ["model.path=tiny-random", "engine.dtype=int8"])
    with pytest.raises(
        ConfigError, match=r"serves no per-role adapters; use engine.kind=hf with engine.dtype bf"
    ):
        open_engine(config, {"ceo": tmp_path / "ceo"})


def test_int8_bfloat16_cache_serves_shared_prefixes_and_conversations(base: object) -> None:
    from horizonrl.engine.hf import HFEngine

    tok = base.tokenizer  # type: ignore[attr-defined]
    engine = HFEngine(_engine(base).model, tok)
    if engine.decoder.kv_dtype is None:
        pytest.skip("this CPU has no native bfloat16 matmuls: the int8 copy keeps a float32 cache")
    shared = tok.encode("alpha beta gamma delta " * 10)
    params = SamplingParams(temperature=1.0, max_new_tokens=5, seed=3)

    async def batch(prompts: list[list[int]]) -> list[object]:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    first = asyncio.run(batch([shared + tok.encode(" one"), shared + tok.encode(" two")]))
    # the next batch shares more than the kept prefix: it is extended under the model's float32
    second = asyncio.run(batch([shared + tok.encode(" three four"), shared + tok.encode(" three five")]))
    # a conversation's next turn starts from its kept cache
    turn = shared + tok.encode(" one") + first[0].token_ids + tok.encode(" and then")
    (third,) = asyncio.run(batch([turn]))
    stats = engine.decoder.stats
    assert stats.prefix_reused_tokens > 2 * len(shared) and stats.conversation_reused_tokens > len(shared)
    kept = engine.decoder.prefix.layers[0][0]  # type: ignore[union-attr]
    assert kept.dtype == torch.bfloat16
    for out in (*first, *second, third):
        assert len(out.token_ids) == 5 and all(math.isfinite(lp) and lp <= 0 for lp in out.logprobs)


def test_int8_is_refused_on_a_cpu_without_int8_dot_products(
    base: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast_copy, "cpu_int8_dot_products", lambda: False)
    with pytest.raises(ConfigError) as refused:
        _engine(base)
    line = str(refused.value)
    assert "\n" not in line and "no int8 dot-product instructions" in line
    assert "engine.dtype float16 or fast" in line and "use engine.dtype bfloat16 or float32" in line


needs_fbgemm = pytest.mark.skipif(
    fast_copy.kernel_unavailable("float16") is not None,
    reason=f"float16 weights need fbgemm: {fast_copy.kernel_unavailable('float16')}",
)


@needs_fbgemm
def test_float16_copy_samples_its_own_logprobs_close_to_float32_and_follows_updates(base: object) -> None:
    from horizonrl.engine.hf import HFEngine
    from horizonrl.trainable import build_policy

    tok = base.tokenizer  # type: ignore[attr-defined]
    built = engine_from_config(base.base, tok, EngineConfig(dtype="float16"), MODEL, 0).model  # type: ignore[attr-defined]
    head = built.lm_head.group
    assert head.kind == "float16" and head.qweight.numel() == 0 and head.packed is not None
    norm = base.base.model.layers[0].input_layernorm.weight  # type: ignore[attr-defined]
    assert built.model.layers[0].input_layernorm.weight.equal(norm)  # not smoothed: nothing is quantized
    engine = HFEngine(built, tok)
    prompt = tok.encode("Write a function that adds two numbers")
    out = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)))
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        own = torch.log_softmax(built(ids).logits[0].float(), -1)
        exact = torch.log_softmax(base.base(ids).logits[0].float(), -1)  # type: ignore[attr-defined]
    n = len(prompt)
    forced = [float(own[n - 1 + i, t]) for i, t in enumerate(out.token_ids)]
    assert forced == pytest.approx(out.logprobs, abs=1e-4)  # the copy's own logprobs
    # float16 weights: closer to the float32 model than bfloat16 weights are (the exact sampler's)
    bf16 = sampler_model(base.base, "bfloat16")  # type: ignore[attr-defined]
    with torch.no_grad():
        half = torch.log_softmax(bf16(ids).logits[0].float(), -1)

    def kl(logp: torch.Tensor) -> float:
        return float((exact.exp() * (exact - logp)).sum(-1).max())

    assert kl(own) < kl(half) / 4
    # a weight update packs the policy's (merged) weights
    policy = build_policy(load_base(MODEL).base, MODEL).model
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.3)
    engine.update_weights(policy)
    with torch.no_grad():
        after, merged = built(ids).logits.float(), policy(ids).logits.float()
    assert (after - merged).abs().max() < 1e-2 * max(1.0, float(merged.abs().max()))
