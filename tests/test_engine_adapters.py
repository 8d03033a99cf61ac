"""HFEngine serving several LoRA adapters on one base model: per-row adapter selection in mixed
batches, KV caches never shared across adapters, loading errors, adapter views."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest
import torch

from horizonrl.engine.base import Engine, SamplingParams
from horizonrl.engine.hf import AdapterView, HFEngine
from horizonrl.model_config import LoraSettings
from horizonrl.models import load_tokenizer, tiny_random_model
from horizonrl.trainable import wrap_lora

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


def _save_adapter(folder: Path, seed: int, model=None) -> Path:
    """A LoRA adapter of the tiny model (or ``model``) with random non-zero B matrices, saved."""
    policy = wrap_lora(model if model is not None else tiny_random_model()[0], LoraSettings(r=4, alpha=8))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    policy.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {"alpha": _save_adapter(root / "alpha", seed=1), "beta": _save_adapter(root / "beta", seed=2)}


def _merged(folder: Path | None, seed: int = 0):
    """The tiny model with the adapter in ``folder`` merged into its weights (None: without one)."""
    from peft import PeftModel

    model = tiny_random_model(seed)[0]
    if folder is None:
        return model
    with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x
        warnings.simplefilter("ignore", FutureWarning)
        return PeftModel.from_pretrained(model, str(folder)).merge_and_unload().eval()


def _engine(folders: dict[str, Path], **kwargs) -> HFEngine:
    model, tokenizer = tiny_random_model()  # a model of its own: adapters are loaded into it
    engine = HFEngine(model, tokenizer, **kwargs)
    for name, folder in folders.items():
        engine.add_adapter(name, folder)
    return engine


async def _alone(folder: Path | None, prompts: list[list[int]], params, seed: int = 0) -> list:
    """Each prompt decoded on its own by an engine over the merged model, without kept caches."""
    engine = HFEngine(_merged(folder, seed), load_tokenizer("tiny-random"), prefix_cache_mib=0)
    engine.decoder.min_shared_prefix = 0
    outs = [
        await engine.generate(p, params if isinstance(params, SamplingParams) else params(i))
        for i, p in enumerate(prompts)
    ]
    await engine.close()
    return outs


def _teacher_forced(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """The log-probabilities ``model`` gives ``completion`` after ``prompt`` (at ``temperature``)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def _prompts(tokenizer, n: int) -> list[list[int]]:
    texts = [f"Question {i}: " + "how many apples " * (1 + 5 * (i % 3)) + "are there?" for i in range(n)]
    return [tokenizer.encode(t) for t in texts]


#: Logprobs of an unmerged adapter (x W + (x A) B) against its merged weights (x (W + A B)) differ
#: by float32 rounding (seen: 1.1e-4 on a logprob of -2.2).
CLOSE = {"atol": 1e-4, "rtol": 1e-4}


def _assert_same(got, expected) -> None:
    for a, b in zip(got, expected, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), **CLOSE)


async def test_each_adapter_samples_what_its_merged_model_samples(folders, tokenizer):
    engine = _engine(folders)
    assert engine.adapters == ("alpha", "beta")
    prompts = _prompts(tokenizer, 3)
    outs = {}
    for name in ("alpha", "beta", None):
        outs[name] = await asyncio.gather(*(engine.generate(p, GREEDY, adapter=name) for p in prompts))
        _assert_same(outs[name], await _alone(folders.get(name), prompts, GREEDY))
    for i in range(len(prompts)):  # the adapters change what is sampled
        assert len({tuple(outs[name][i].token_ids) for name in outs}) == 3
    await engine.close()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
async def test_one_batch_mixing_adapters_samples_what_each_samples_alone(folders, tokenizer, temperature):
    """Rows of two adapters and of the base model decoded in one batch: greedy rows sample exactly
    what they sample alone, and every row's logprobs are those of its adapter's merged model on its
    own sequence (teacher forcing; a sampled token may flip at a near tie, so only greedy tokens are
    compared)."""
    engine = _engine(folders)
    prompts = _prompts(tokenizer, 9)
    names = ["alpha", "beta", None] * 3

    def params(i: int) -> SamplingParams:
        return SamplingParams(temperature=temperature, max_new_tokens=10 + i, seed=50 + i)

    mixed = await asyncio.gather(
        *(
            engine.generate(p, params(i), adapter=n)
            for i, (p, n) in enumerate(zip(prompts, names, strict=True))
        )
    )
    assert engine.stats["batches"] == 1
    for name in ("alpha", "beta", None):
        rows = [i for i, n in enumerate(names) if n == name]
        if temperature == 0.0:
            alone = await _alone(
                folders.get(name), [prompts[i] for i in rows], lambda j, r=rows: params(r[j])
            )
            _assert_same([mixed[i] for i in rows], alone)
        model = _merged(folders.get(name))
        for i in rows:
            expected = _teacher_forced(model, prompts[i], mixed[i].token_ids, temperature)
            torch.testing.assert_close(torch.tensor(mixed[i].logprobs), expected, **CLOSE)
    await engine.close()


async def test_rows_of_other_adapters_join_a_running_batch(folders, tokenizer):
    engine = _engine(folders, prefix_cache_mib=0)
    prompts = _prompts(tokenizer, 4)
    names = ["beta", None, "alpha", "beta"]
    first = asyncio.create_task(
        engine.generate(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=200), adapter="alpha")
    )
    while engine.stats["generated_tokens"] < 5:  # the first batch is decoding
        await asyncio.sleep(0.005)
    joined = await asyncio.gather(
        *(engine.generate(p, GREEDY, adapter=n) for p, n in zip(prompts, names, strict=True))
    )
    assert not first.done()
    await first
    assert engine.stats["admitted_requests"] == len(prompts) and engine.stats["batches"] == 1
    for prompt, name, out in zip(prompts, names, joined, strict=True):
        _assert_same([out], await _alone(folders.get(name), [prompt], GREEDY))
    await engine.close()


async def test_kv_caches_are_never_shared_across_adapters(folders, tokenizer):
    """Prompts sharing a long system prompt, and a conversation continued under another adapter:
    no KV cache computed under one adapter serves another, and every result is what the adapter's
    merged model samples with no cache at all."""
    engine = _engine(folders, prefix_cache_mib=1024)
    system = tokenizer.encode("You are a careful agent. " * 8)
    assert len(system) >= 32
    p1, p2, p3 = (system + p for p in _prompts(tokenizer, 3))

    async def run(name, prompts):
        outs = await asyncio.gather(*(engine.generate(p, GREEDY, adapter=name) for p in prompts))
        _assert_same(outs, await _alone(folders.get(name), prompts, GREEDY))
        return outs

    await run("alpha", [p1, p2])
    assert engine.decoder.prefix is not None and engine.decoder.prefix.adapter == "alpha"
    await run("beta", [p1, p3])  # the same prefix, another adapter: computed anew
    assert engine.decoder.prefix.adapter == "beta"
    reused = engine.stats["prefix_reused_tokens"]
    await run("beta", [p2, p3])  # ... which the same adapter then reuses
    assert engine.stats["prefix_reused_tokens"] >= reused + 2 * len(system)
    mixed = await asyncio.gather(engine.generate(p1, GREEDY, adapter="beta"), engine.generate(p2, GREEDY))
    _assert_same(mixed[:1], await _alone(folders["beta"], [p1], GREEDY))
    _assert_same(mixed[1:], await _alone(None, [p2], GREEDY))

    # Multi-turn: the first turn under alpha, the next one under beta, then under alpha.
    engine.drop_caches()
    (first,) = await run("alpha", [p1])
    turn2 = p1 + first.token_ids + tokenizer.encode("\nTool says: 42 apples.\n")
    before = engine.stats["conversation_reused_tokens"]
    await run("beta", [turn2])
    assert engine.stats["conversation_reused_tokens"] == before  # alpha's conversation is not beta's
    await run("alpha", [turn2])
    assert engine.stats["conversation_reused_tokens"] >= before + len(p1)  # ... but alpha's own
    await engine.close()


async def test_forwards_name_adapters_only_when_adapters_are_served(folders, tokenizer):
    engine = _engine({})
    seen: list[dict] = []
    handle = engine.model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw), with_kwargs=True)
    prompts = _prompts(tokenizer, 3)
    await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    assert seen and not any("adapter_names" in kw for kw in seen)
    handle.remove()

    engine.add_adapter("alpha", folders["alpha"])
    seen.clear()
    engine.decoder.model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw), with_kwargs=True)
    await asyncio.gather(
        *(
            engine.generate(p, GREEDY, adapter=n)
            for p, n in zip(prompts, ["alpha", None, "alpha"], strict=True)
        )
    )
    assert seen and all(len(kw["adapter_names"]) == len(kw["input_ids"]) for kw in seen)
    assert {name for kw in seen for name in kw["adapter_names"]} == {"alpha", "__base__"}
    await engine.close()


async def test_adapter_errors(folders, tokenizer, tmp_path):
    engine = _engine({"alpha": folders["alpha"]})
    prompt = _prompts(tokenizer, 1)[0]
    with pytest.raises(ValueError, match=r"unknown adapter 'gamma' \(adapters: 'alpha'"):
        await engine.generate(prompt, GREEDY, adapter="gamma")
    with pytest.raises(ValueError, match="unknown adapter"):
        engine.view("gamma")
    with pytest.raises(ValueError, match="reserved"):
        engine.add_adapter("__base__", folders["beta"])
    for bad in ("", "a", "v1.2"):  # PEFT keys modules by name and misreads names inside "lora_"
        with pytest.raises(ValueError, match=r"adapter name|cannot hold"):
            engine.add_adapter(bad, folders["beta"])
    with pytest.raises(RuntimeError, match="PEFT model already"):
        HFEngine(wrap_lora(tiny_random_model()[0], LoraSettings(r=2)), tokenizer).add_adapter(
            "x", folders["beta"]
        )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: no adapter_config\.json"):
        engine.add_adapter("beta", tmp_path / "empty")
    with pytest.raises(ValueError, match=r"no adapter_config\.json"):
        engine.add_adapter("beta", tmp_path / "missing")
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama(**changes) -> LlamaForCausalLM:
        shape = dict(
            vocab_size=100,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
        )
        return LlamaForCausalLM(LlamaConfig(**{**shape, **changes}))

    wider = _save_adapter(tmp_path / "wider", seed=3, model=llama(intermediate_size=96))
    with pytest.raises(ValueError, match=r"wider: model\.layers\.0\.mlp\.\w+_proj: lora_A .* do not fit"):
        engine.add_adapter("beta", wider)
    deeper = _save_adapter(tmp_path / "deeper", seed=3, model=llama(num_hidden_layers=3))
    with pytest.raises(ValueError, match=r"deeper: the model has no module model\.layers\.2\."):
        engine.add_adapter("beta", deeper)
    assert engine.adapters == ("alpha",)  # nothing was loaded
    _assert_same(
        [await engine.generate(prompt, GREEDY, adapter="alpha")],
        await _alone(folders["alpha"], [prompt], GREEDY),
    )
    await engine.close()


async def test_a_failed_load_leaves_the_engine_as_it_was(folders, tokenizer, monkeypatch):
    """Should PEFT fail after the folder was checked, the adapter is removed again, and the model
    unwrapped when no adapter is left (the first one, or a failed replacement of the only one)."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    prompt = _prompts(tokenizer, 1)[0]
    fresh, replaced = _engine({}), _engine({"alpha": folders["alpha"]})
    plain = await fresh.generate(prompt, GREEDY)

    def boom(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(PeftModel, "load_adapter", boom)
    for engine in (fresh, replaced):
        with pytest.raises(ValueError, match=r"alpha: PEFT could not load it: RuntimeError: boom"):
            engine.add_adapter("alpha", folders["alpha"])
        assert engine.adapters == () and not engine.decoder.per_row_adapters
        assert not any(isinstance(m, LoraLayer) for m in engine.model.modules())
        assert (await engine.generate(prompt, GREEDY)).token_ids == plain.token_ids
    monkeypatch.undo()
    for engine in (fresh, replaced):  # ... and can take adapters again
        engine.add_adapter("beta", folders["beta"])
        assert engine.adapters == ("beta",)
        _assert_same(
            [await engine.generate(prompt, GREEDY, adapter="beta")],
            await _alone(folders["beta"], [prompt], GREEDY),
        )
        await engine.close()


async def test_replacing_an_adapter_and_new_base_weights(folders, tokenizer):
    engine = _engine({"alpha": folders["alpha"]})
    prompt = _prompts(tokenizer, 1)[0]
    await engine.generate(prompt, GREEDY, adapter="alpha")
    engine.add_adapter("alpha", folders["beta"])  # replaces the only adapter
    assert engine.adapters == ("alpha",)
    assert engine.stats["conversation_cache_tokens"] == 0
    _assert_same(
        [await engine.generate(prompt, GREEDY, adapter="alpha")],
        await _alone(folders["beta"], [prompt], GREEDY),
    )

    # New base weights: the base rows take them, the adapter applies on top of them.
    engine.update_weights(tiny_random_model(seed=1)[0])
    assert engine.weights_version == 1
    base, adapted = await asyncio.gather(
        engine.generate(prompt, GREEDY), engine.generate(prompt, GREEDY, adapter="alpha")
    )
    _assert_same([adapted], await _alone(folders["beta"], [prompt], GREEDY, seed=1))
    _assert_same([base], await _alone(None, [prompt], GREEDY, seed=1))
    await engine.close()


async def test_adapter_weights_take_the_models_dtype(folders, tokenizer):
    model, _ = tiny_random_model()
    engine = HFEngine(model.to(torch.bfloat16), tokenizer)
    engine.add_adapter("alpha", folders["alpha"])
    lora = [p for n, p in engine.decoder.model.named_parameters() if "lora_" in n]
    assert lora and all(p.dtype == torch.bfloat16 for p in lora)
    out = await engine.generate(_prompts(tokenizer, 1)[0], GREEDY, adapter="alpha")
    assert len(out.token_ids) == GREEDY.max_new_tokens
    await engine.close()


async def test_adapter_view_is_an_engine_for_one_adapter(folders, tokenizer):
    engine = _engine(folders)
    view = engine.view("beta")
    assert isinstance(view, AdapterView) and isinstance(view, Engine)
    assert (view.eos_token_ids, view.vocab_size, view.pad_token_id, view.max_context) == (
        engine.eos_token_ids,
        engine.vocab_size,
        engine.pad_token_id,
        engine.max_context,
    )
    prompt = _prompts(tokenizer, 1)[0]
    streamed: list[int] = []
    via_view, direct = await asyncio.gather(
        view.generate(prompt, GREEDY, on_token=lambda t, _lp: streamed.append(t)),
        engine.generate(prompt, GREEDY, adapter="beta"),
    )
    assert via_view.token_ids == direct.token_ids == streamed
    assert view.stats["requests"] == 2 and view.weights_version == engine.weights_version == 0
    base = await engine.view(None).generate(prompt, GREEDY)
    assert base.token_ids == (await engine.generate(prompt, GREEDY)).token_ids
    with pytest.raises(RuntimeError, match="add_adapter"):
        view.update_weights(engine.model)
    await view.close()  # the engine stays open
    assert (await view.generate(prompt, GREEDY)).token_ids == direct.token_ids
    await engine.close()


async def test_removing_adapters_frees_them_and_is_refused_while_they_have_requests(folders, tokenizer):
    from peft.tuners.lora import LoraLayer

    prompt = _prompts(tokenizer, 1)[0]
    engine = _engine({})
    plain_params = sum(p.numel() for p in engine.model.parameters())
    base = await engine.generate(prompt, GREEDY)
    for name, folder in folders.items():
        engine.add_adapter(name, folder)
    queued = asyncio.ensure_future(engine.generate(prompt, GREEDY, adapter="alpha"))
    await asyncio.sleep(0)  # the call is queued
    with pytest.raises(RuntimeError, match=r"adapter 'alpha' has 1 request\(s\) running or queued"):
        engine.remove_adapter("alpha")
    _assert_same([await queued], await _alone(folders["alpha"], [prompt], GREEDY))
    engine.remove_adapter("beta")
    assert engine.adapters == ("alpha",)
    with pytest.raises(ValueError, match="unknown adapter 'beta'"):
        await engine.generate(prompt, GREEDY, adapter="beta")
    _assert_same(
        [await engine.generate(prompt, GREEDY, adapter="alpha")],
        await _alone(folders["alpha"], [prompt], GREEDY),
    )
    engine.remove_adapter("alpha")  # the last one: the plain model again, its LoRA weights gone
    assert engine.adapters == () and not engine.decoder.per_row_adapters
    assert not any(isinstance(m, LoraLayer) for m in engine.model.modules())
    assert sum(p.numel() for p in engine.model.parameters()) == plain_params
    assert (await engine.generate(prompt, GREEDY)).token_ids == base.token_ids
    with pytest.raises(ValueError, match="unknown adapter 'alpha'"):
        engine.remove_adapter("alpha")
    engine.add_adapter("beta", folders["beta"])  # and takes adapters again
    _assert_same(
        [await engine.generate(prompt, GREEDY, adapter="beta")],
        await _alone(folders["beta"], [prompt], GREEDY),
    )
    await engine.close()


async def test_rows_of_each_adapter_share_their_prompt_prefix_in_a_mixed_batch(folders, tokenizer):
    engine = _engine(folders, prefix_cache_mib=0)
    system = tokenizer.encode("You are a careful agent. " * 8)
    prompts = [system + p for p in _prompts(tokenizer, 2)] * 2 + [system + _prompts(tokenizer, 3)[2]]
    names = ["alpha", "alpha", "beta", "beta", None]  # the base row alone: its whole prompt
    outs = await asyncio.gather(
        *(engine.generate(p, GREEDY, adapter=n) for p, n in zip(prompts, names, strict=True))
    )
    assert engine.stats["batches"] == 1
    assert engine.stats["prefix_reused_tokens"] >= 2 * len(system)  # one prefix per adapter, each reused
    for name in ("alpha", "beta", None):
        rows = [i for i, n in enumerate(names) if n == name]
        _assert_same(
            [outs[i] for i in rows], await _alone(folders.get(name), [prompts[i] for i in rows], GREEDY)
        )
    await engine.close()
