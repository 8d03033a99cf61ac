"""HFEngine: batching, exactness against unbatched decoding, logprobs, stopping, seeds, weights."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from horizonrl.engine.base import Engine, SamplingParams
from horizonrl.engine.batch import prefill_groups
from horizonrl.engine.hf import HFEngine
from horizonrl.engine.sampling import sample
from horizonrl.models import tiny_random_model

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


@pytest.fixture(scope="module")
def tiny():
    """The tiny random model shared read-only by the tests of this module."""
    return tiny_random_model()


@pytest.fixture
async def engine(tiny):
    model, tokenizer = tiny
    eng = HFEngine(model, tokenizer)
    yield eng
    await eng.close()


def _prompts(tokenizer, n: int = 8) -> list[list[int]]:
    texts = [f"Question {i}: " + "how many apples " * (1 + 9 * (i % 4)) + "are there?" for i in range(n)]
    return [tokenizer.encode(t) for t in texts]


def _reference_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=2
        )
    return out[0, len(prompt) :].tolist()


def _teacher_forced_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_engine_satisfies_protocol(engine):
    assert isinstance(engine, Engine)


@pytest.mark.parametrize("continuous", [True, False])
async def test_concurrent_requests_are_batched_and_equal_solo_greedy(tiny, engine, continuous):
    model, tokenizer = tiny
    engine.continuous_batching = continuous
    prompts = _prompts(tokenizer)
    assert len({len(p) for p in prompts}) > 1  # different lengths exercise left padding
    lengths = [len(p) for p in prompts]  # ... and grouped prefill with merged caches
    assert (
        len(
            prefill_groups(lengths, engine.decoder.prefill_overhead_tokens, engine.decoder.max_prefill_tokens)
        )
        > 1
    )
    completions = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    stats = engine.stats
    assert stats["requests"] == len(prompts)
    assert stats["batches"] < stats["requests"]
    assert stats["generated_tokens"] == sum(len(c.token_ids) for c in completions)
    for prompt, completion in zip(prompts, completions, strict=True):
        assert completion.token_ids == _reference_greedy(model, prompt, GREEDY.max_new_tokens)
        expected = _teacher_forced_logprobs(model, prompt, completion.token_ids, 0.0)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9)])
async def test_logprobs_match_teacher_forcing(tiny, engine, temperature, top_p):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 4)
    params = [
        SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=i)
        for i in range(len(prompts))
    ]
    completions = await asyncio.gather(
        *(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True))
    )
    for prompt, completion in zip(prompts, completions, strict=True):
        assert len(completion.token_ids) == len(completion.logprobs) > 0
        expected = _teacher_forced_logprobs(model, prompt, completion.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


async def test_max_new_tokens_gives_length(tiny, engine):
    _, tokenizer = tiny
    completion = await engine.generate(tokenizer.encode("Count:"), SamplingParams(max_new_tokens=5, seed=1))
    assert completion.finish_reason == "length"
    assert len(completion.token_ids) == 5


async def test_mixed_params_in_one_batch(tiny, engine):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 4)
    params = [
        GREEDY,
        SamplingParams(temperature=1.0, max_new_tokens=3),
        SamplingParams(temperature=0.5, top_p=0.5, max_new_tokens=9, seed=7),
        SamplingParams(temperature=0.0, max_new_tokens=7),
    ]
    completions = await asyncio.gather(
        *(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True))
    )
    assert engine.stats["batches"] == 1
    assert [len(c.token_ids) for c in completions] == [16, 3, 9, 7]
    assert completions[0].token_ids == _reference_greedy(model, prompts[0], 16)
    assert completions[3].token_ids == _reference_greedy(model, prompts[3], 7)


async def test_stop_strings_end_the_completion(tiny, engine):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 3)
    requests = []
    for i, prompt in enumerate(prompts):
        ref = _reference_greedy(model, prompt, 16)
        stop = tokenizer.decode(ref[: 5 + i])[-3:]  # a string completed by token 4 + i (or earlier)
        end = next(k for k in range(len(ref)) if stop in tokenizer.decode(ref[: k + 1]))
        requests.append((prompt, stop, ref[: end + 1]))
    completions = await asyncio.gather(
        *(
            engine.generate(p, SamplingParams(temperature=0.0, max_new_tokens=16, stop=(s,)))
            for p, s, _ in requests
        )
    )
    for (_, stop, expected), completion in zip(requests, completions, strict=True):
        assert completion.finish_reason == "stop"
        assert completion.token_ids == expected
        assert stop in tokenizer.decode(completion.token_ids)


async def test_eos_ends_the_completion(tiny, engine):
    model, tokenizer = tiny
    prompt = _prompts(tokenizer, 1)[0]
    ref = _reference_greedy(model, prompt, 16)
    eos = ref[3]
    engine.eos_token_ids = frozenset({eos})
    completion = await engine.generate(prompt, GREEDY)
    assert completion.finish_reason == "stop"
    assert completion.token_ids == ref[: ref.index(eos) + 1]


def test_default_eos_includes_tokenizer_eos(tiny):
    model, tokenizer = tiny
    assert tokenizer.eos_token_id in HFEngine(model, tokenizer).eos_token_ids


async def test_seeded_requests_reproduce(tiny, engine):
    _, tokenizer = tiny
    prompts = _prompts(tokenizer, 4)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=123)
    alone = await engine.generate(prompts[0], params)
    again = await engine.generate(prompts[0], params)
    in_batch = await asyncio.gather(
        engine.generate(prompts[0], params),
        *(engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=4)) for p in prompts[1:]),
    )
    other_seed = await engine.generate(prompts[0], params.model_copy(update={"seed": 124}))
    assert alone.token_ids == again.token_ids == in_batch[0].token_ids
    assert other_seed.token_ids != alone.token_ids


async def test_oversize_prompt_raises(tiny):
    model, tokenizer = tiny
    eng = HFEngine(model, tokenizer, max_context=32)
    with pytest.raises(ValueError, match="context"):
        await eng.generate(list(range(100, 140)), GREEDY)
    with pytest.raises(ValueError, match="max_new_tokens"):
        await eng.generate(list(range(100, 120)), SamplingParams(max_new_tokens=20))
    with pytest.raises(ValueError, match="token ids"):
        await eng.generate([1, 2, 10**6], GREEDY)
    assert (await eng.generate(list(range(100, 116)), GREEDY)).finish_reason == "length"
    await eng.close()


async def test_error_in_batch_reaches_every_caller(tiny, engine, monkeypatch):
    _, tokenizer = tiny

    def boom(*args):
        raise RuntimeError("boom in batch")

    monkeypatch.setattr(engine.decoder, "_decode", boom)
    results = await asyncio.gather(
        *(engine.generate(p, GREEDY) for p in _prompts(tokenizer, 5)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) and "boom" in str(r) for r in results)
    monkeypatch.undo()
    assert len((await engine.generate(_prompts(tokenizer, 1)[0], GREEDY)).token_ids) == 16  # still serves


async def test_event_loop_stays_free_during_a_batch(tiny, engine):
    _, tokenizer = tiny
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_new_tokens=48)) for p in _prompts(tokenizer))
    )
    task.cancel()
    assert ticks > 5


async def test_decoding_runs_on_the_event_loop_thread(tiny, engine):
    """All forward passes run on the thread of the caller's event loop (the trainer's thread in a
    training run): a second thread running torch ops would get its own OpenMP team and throttle
    both (see the module doc of horizonrl.engine.hf)."""
    model, tokenizer = tiny
    threads: set[int] = set()
    handle = model.register_forward_pre_hook(lambda *_: threads.add(threading.get_ident()))
    try:
        await asyncio.gather(*(engine.generate(p, GREEDY) for p in _prompts(tokenizer, 4)))
    finally:
        handle.remove()
    assert threads == {threading.get_ident()}


async def test_update_weights_inside_a_running_batch_raises_instead_of_waiting_forever(tiny, engine):
    """A batch holds the weights lock between its steps; an update from a coroutine of the same loop
    would wait for itself, so it is refused with a message that says what to do instead."""
    model, tokenizer = tiny
    long_request = engine.generate(_prompts(tokenizer, 1)[0], SamplingParams(max_new_tokens=200))
    first = asyncio.create_task(long_request)
    while engine.stats["generated_tokens"] < 3:  # the batch is decoding
        await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="between rollouts"):
        engine.update_weights(model)
    with pytest.raises(RuntimeError, match="drop_caches"):
        engine.drop_caches()
    await first
    engine.update_weights(model)  # between rollouts it goes through
    assert engine.weights_version == 1


async def test_close_fails_new_requests(tiny):
    model, tokenizer = tiny
    eng = HFEngine(model, tokenizer)
    await eng.generate([1, 2, 3], GREEDY)
    await eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        await eng.generate([1, 2, 3], GREEDY)


async def test_update_weights(tiny):
    _, tokenizer = tiny
    model_a, _ = tiny_random_model(seed=0)
    model_b, _ = tiny_random_model(seed=1)
    prompt = _prompts(tokenizer, 1)[0]
    eng = HFEngine(model_a, tokenizer)
    before = await eng.generate(prompt, GREEDY)
    eng.update_weights(model_a)  # same object: only the version moves
    assert eng.weights_version == 1
    expected_b = _reference_greedy(model_b, prompt, 16)
    assert expected_b != before.token_ids
    eng.update_weights(model_b)
    assert eng.weights_version == 2
    assert (await eng.generate(prompt, GREEDY)).token_ids == expected_b
    assert eng.stats["weights_version"] == 2

    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(
        tiny_random_model(seed=2)[0], LoraConfig(r=4, target_modules=["q_proj", "up_proj"])
    )
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    policy.eval()
    eng.update_weights(policy)
    assert (await eng.generate(prompt, GREEDY)).token_ids == _reference_greedy(policy, prompt, 16)

    # A PEFT engine model takes a PEFT policy's weights (adapter included) as they are.
    peft_engine = HFEngine(
        get_peft_model(tiny_random_model(seed=3)[0], LoraConfig(r=4, target_modules=["q_proj", "up_proj"])),
        tokenizer,
    )
    peft_engine.update_weights(policy)
    assert (await peft_engine.generate(prompt, GREEDY)).token_ids == _reference_greedy(policy, prompt, 16)
    await peft_engine.close()

    wrong = HFEngine(tiny_random_model()[0], tokenizer)
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
        )
    )
    with pytest.raises(ValueError, match="do not fit"):
        wrong.update_weights(other)
    await eng.close()
    await wrong.close()


def test_update_weights_merges_lora_one_weight_at_a_time():
    """A LoRA policy's merged weights are made one by one as they are copied, not as a whole merged
    copy of the model up front (that copy cost ~0.4 GiB for SmolLM2-135M at every RL step)."""
    from peft import LoraConfig, get_peft_model

    from horizonrl.engine.weights import plain_weights

    policy = get_peft_model(
        tiny_random_model(seed=2)[0], LoraConfig(r=4, target_modules=["q_proj", "up_proj"])
    )
    merges = []
    for name, module in policy.get_base_model().named_modules():
        if hasattr(module, "get_delta_weight"):
            original = module.get_delta_weight
            module.get_delta_weight = lambda adapter, original=original, name=name: (
                merges.append(name) or original(adapter)
            )
    weights = plain_weights(policy)
    assert merges == []  # nothing merged yet
    adapted = [key for key in weights if key.endswith(("q_proj.weight", "up_proj.weight"))]
    assert adapted and all(".lora_" not in key and ".base_layer." not in key for key in weights)
    first = weights[adapted[0]].make()
    assert len(merges) == 1 and first.shape == weights[adapted[0]].shape


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 1.0), (1.0, 0.7)])
def test_sampling_distribution(temperature, top_p):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n = 20000
    shared = torch.Generator().manual_seed(3)
    tokens, logprobs = sample(
        logits.expand(n, -1), torch.full((n,), temperature), torch.full((n,), top_p), [None] * n, shared
    )
    probs = torch.softmax(logits / temperature, -1)
    torch.testing.assert_close(logprobs, probs.log()[tokens])  # full-distribution logprobs
    keep = (probs.sort(descending=True).values.cumsum(0) - probs.sort(descending=True).values) < top_p
    target = torch.zeros(5)
    target[probs.sort(descending=True).indices[keep]] = probs.sort(descending=True).values[keep]
    target /= target.sum()
    freq = torch.bincount(tokens, minlength=5).float() / n
    torch.testing.assert_close(freq, target, atol=0.015, rtol=0)


def testprefill_groups():
    assert prefill_groups([5, 5, 5], 32, 8192) == [[0, 1, 2]]
    groups = prefill_groups([10, 500, 12, 480, 11], 32, 8192)
    assert groups == [[0, 4, 2], [3, 1]]
    assert prefill_groups([100] * 4, 1, 250) == [[0, 1], [2, 3]]  # token budget per call
    assert sorted(i for g in prefill_groups([7, 3, 9, 1000, 2], 16, 64) for i in g) == [0, 1, 2, 3, 4]


async def test_prefill_grouping_matches_single_call(tiny, engine):
    _, tokenizer = tiny
    prompts = _prompts(tokenizer)
    params = SamplingParams(temperature=0.8, max_new_tokens=10, seed=5)
    grouped = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    engine.decoder.mergeable_cache = False
    single = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    for a, b in zip(grouped, single, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_engine_survives_a_new_event_loop(tiny):
    model, tokenizer = tiny
    eng = HFEngine(model, tokenizer)
    first = asyncio.run(eng.generate([1, 2, 3], GREEDY))
    second = asyncio.run(eng.generate([1, 2, 3], GREEDY))  # batcher restarts on the new loop
    assert first.token_ids == second.token_ids
    asyncio.run(eng.close())


def _shared_prefix_prompts(tokenizer) -> list[list[int]]:
    system = tokenizer.encode("You are a careful agent. " * 12)  # ~60 tokens every prompt shares
    return [system + p for p in _prompts(tokenizer)]


async def test_shared_prefix_cache_matches_full_prefill(tiny, engine):
    """Rows sharing a system prompt reuse its KV cache (within and across batches) and sample
    exactly what a full prefill samples; new weights drop the cache."""
    _, tokenizer = tiny
    prompts = _shared_prefix_prompts(tokenizer)
    params = SamplingParams(temperature=0.8, max_new_tokens=10, seed=5)
    cached = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    reused = engine.stats["prefix_reused_tokens"]
    assert reused >= 60 * (len(prompts) - 1)
    again = await engine.generate(prompts[3], params)  # a later batch of one reuses the prefix
    assert engine.stats["prefix_reused_tokens"] >= reused + 60
    engine.decoder.min_shared_prefix = 0
    full = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    for a, b in zip([*cached, again], [*full, full[3]], strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    engine.decoder.min_shared_prefix = 32
    engine.update_weights(engine.model)
    assert engine.decoder.prefix is None


async def test_shared_prefix_logprobs_match_teacher_forcing(tiny, engine):
    model, tokenizer = tiny
    prompts = _shared_prefix_prompts(tokenizer)[:4]
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    assert engine.stats["prefix_reused_tokens"] > 0
    for prompt, out in zip(prompts, outs, strict=True):
        expected = _teacher_forced_logprobs(model, prompt, out.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


def test_fast_decode_attention_samples_what_sdpa_samples(tiny):
    import copy

    model, tokenizer = tiny
    fast = HFEngine(copy.deepcopy(model), tokenizer)
    plain = HFEngine(copy.deepcopy(model), tokenizer, fast_decode=False)
    assert fast.decoder.fast_decode and not plain.decoder.fast_decode
    assert fast.model.config._attn_implementation == "horizonrl_cpu"
    prompts = _shared_prefix_prompts(tokenizer)
    params = SamplingParams(temperature=0.9, max_new_tokens=12, seed=11)

    async def run(eng):
        return await asyncio.gather(*(eng.generate(p, params) for p in prompts))

    for a, b in zip(asyncio.run(run(fast)), asyncio.run(run(plain)), strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


async def _three_turns(engine, tokenizer, params):
    """Six conversations of different lengths, three turns each (prompt + completion + a tool
    observation), with two fresh prompts joining the second turn's batch; returns every completion."""
    convs = _prompts(tokenizer, 6)
    observation = tokenizer.encode("\nTool says: 42 apples.\n")
    fresh = _prompts(tokenizer, 8)[6:]
    outs = []
    for turn in range(3):
        extra = fresh if turn == 1 else []
        results = await asyncio.gather(*(engine.generate(p, params) for p in [*convs, *extra]))
        outs.append(results)
        convs = [p + r.token_ids + observation for p, r in zip(convs, results, strict=False)]
    return outs, convs


async def test_next_turn_reuses_the_conversation_kv_cache_and_samples_the_same(tiny):
    """A prompt that extends an earlier prompt + completion takes that row's KV cache and prefills
    only the new tokens, and samples exactly what an engine without the cache samples (same
    tokens, same logprobs, and logprobs equal to teacher forcing)."""
    model, tokenizer = tiny
    params = SamplingParams(temperature=0.9, max_new_tokens=12, seed=11)
    cached = HFEngine(model, tokenizer, prefix_cache_mib=1024)
    plain = HFEngine(model, tokenizer, prefix_cache_mib=0)
    with_cache, convs = await _three_turns(cached, tokenizer, params)
    without, convs_plain = await _three_turns(plain, tokenizer, params)
    assert convs == convs_plain
    assert plain.stats["conversation_reused_tokens"] == 0
    # turns 2 and 3 of all six conversations reuse at least their previous prompt
    first_prompts = sum(len(p) for p in _prompts(tokenizer, 6))
    assert cached.stats["conversation_reused_tokens"] >= 2 * first_prompts
    for turn_a, turn_b in zip(with_cache, without, strict=True):
        for a, b in zip(turn_a, turn_b, strict=True):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    last_prompt = convs[0][
        : -len(with_cache[2][0].token_ids) - len(tokenizer.encode("\nTool says: 42 apples.\n"))
    ]
    expected = _teacher_forced_logprobs(model, last_prompt, with_cache[2][0].token_ids, 0.9)
    torch.testing.assert_close(torch.tensor(with_cache[2][0].logprobs), expected, atol=1e-4, rtol=0)
    await cached.close()
    await plain.close()


async def test_conversation_cache_respects_its_budget_and_is_dropped_with_new_weights(tiny):
    model, tokenizer = tiny
    c = model.config
    token_bytes = 2 * c.num_hidden_layers * c.num_key_value_heads * c.hidden_size // c.num_attention_heads * 4
    budget = 300 * token_bytes / 2**20  # 300 float32 tokens, in MiB: fewer than three turns of six rows hold
    eng = HFEngine(model, tokenizer, prefix_cache_mib=budget)
    await _three_turns(eng, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert 0 < eng.stats["conversation_cache_mib"] <= budget
    assert eng.stats["conversation_cache_mib"] * 2**20 == eng.stats["conversation_cache_tokens"] * token_bytes
    assert eng.stats["conversation_cache_tokens"] > 200  # evicted down to the budget, not emptied
    eng.update_weights(model)
    assert eng.stats["conversation_cache_tokens"] == 0
    await _three_turns(eng, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert eng.stats["conversation_cache_tokens"] > 0
    eng.drop_caches()
    assert eng.stats["conversation_cache_tokens"] == 0 and eng.decoder.prefix is None
    with pytest.raises(ValueError, match="prefix_cache_mib"):
        HFEngine(model, tokenizer, prefix_cache_mib=-1)
    await eng.close()


async def test_a_finished_row_is_delivered_before_its_batch_ends(tiny, engine):
    """Continuous batching, delivery side: a short request resolves as soon as its row finishes,
    while a long request of the same batch is still decoding."""
    _, tokenizer = tiny
    short, long = _prompts(tokenizer, 2)
    finished: list[str] = []

    async def ask(name: str, prompt: list[int], n: int) -> None:
        await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=n))
        finished.append(name)

    await asyncio.gather(ask("long", long, 200), ask("short", short, 2))
    assert finished == ["short", "long"]
    assert engine.stats["batches"] == 1  # one batch: the short one did not wait for its end


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_requests_arriving_mid_batch_join_it_and_sample_what_they_would_alone(tiny, temperature):
    """Continuous batching, admission side: requests sent while a batch decodes are prefilled and
    merged into the running batch (left-padded KV caches of different lengths); greedy rows sample
    exactly what they sample alone, and every row's logprobs are those of the model on its own
    sequence (teacher forcing), so the merged cache is exact."""
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6)

    def params(i: int) -> SamplingParams:
        return SamplingParams(temperature=temperature, max_new_tokens=12 + 7 * i, seed=100 + i)

    solo_engine = HFEngine(model, tokenizer, prefix_cache_mib=0, continuous_batching=False)
    solo = [await solo_engine.generate(p, params(i)) for i, p in enumerate(prompts)]
    await solo_engine.close()

    eng = HFEngine(model, tokenizer, prefix_cache_mib=0)
    first = asyncio.create_task(eng.generate(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=400)))
    while eng.stats["generated_tokens"] < 5:  # the first batch is decoding
        await asyncio.sleep(0.005)
    joined = await asyncio.gather(*(eng.generate(p, params(i)) for i, p in enumerate(prompts)))
    assert not first.done()  # they finished inside the first batch
    await first
    assert eng.stats["admitted_requests"] == len(prompts) and eng.stats["batches"] == 1
    for prompt, alone, together in zip(prompts, solo, joined, strict=True):
        if temperature == 0.0:
            assert together.token_ids == alone.token_ids
        expected = _teacher_forced_logprobs(model, prompt, together.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(together.logprobs), expected, atol=1e-4, rtol=0)
    await eng.close()


@pytest.mark.parametrize("reuse", [True, False])
async def test_rows_that_join_after_others_finished_take_their_place_and_sample_exactly(
    tiny, monkeypatch, reuse
):
    """Multi-turn traffic: rows finish and others join the running batch, wider and narrower than it.
    With ``reuse_kv_buffers`` the joiners are written into the rows the finished ones left (the
    batch's rows moved right for a wider one) and dropped rows' leading columns leave in place;
    either way greedy rows sample what they sample alone, with the model's own logprobs."""
    import horizonrl.engine.batch as batch_module

    model, tokenizer = tiny
    placed = []
    real_join = batch_module.join_in_place
    monkeypatch.setattr(batch_module, "join_in_place", lambda *a: placed.append(real_join(*a)) or placed[-1])
    short, wide = _prompts(tokenizer, 4)[:2], _prompts(tokenizer, 8)[3::4]  # 2 short, then 2 long prompts
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    solo_engine = HFEngine(model, tokenizer, prefix_cache_mib=0, continuous_batching=False)
    solo = [await solo_engine.generate(p, params) for p in short + wide]
    await solo_engine.close()

    eng = HFEngine(model, tokenizer, prefix_cache_mib=0)
    eng.decoder.reuse_kv_buffers = reuse
    eng.decoder.drop_unattended_columns = 1
    eng.decoder.kv_grow_tokens = 256  # room to move the batch right for the wide prompts
    long_run = SamplingParams(temperature=0.0, max_new_tokens=300)
    first = asyncio.create_task(eng.generate(_prompts(tokenizer, 1)[0], long_run))
    while eng.stats["generated_tokens"] < 3:
        await asyncio.sleep(0.005)
    together = list(await asyncio.gather(*(eng.generate(p, params) for p in short)))  # join, finish
    together += await asyncio.gather(*(eng.generate(p, params) for p in wide))  # join the holes, wider
    assert not first.done()
    await first
    await eng.close()
    for prompt, alone, row in zip(short + wide, solo, together, strict=True):
        assert row.token_ids == alone.token_ids
        expected = _teacher_forced_logprobs(model, prompt, row.token_ids, 0.0)
        torch.testing.assert_close(torch.tensor(row.logprobs), expected, atol=1e-4, rtol=0)
    in_place = [mask is not None for mask in placed]
    assert any(in_place) if reuse else not placed


async def test_output_head_gets_contiguous_rows_at_prefill(tiny):
    """transformers applies the head to ``hidden[:, -1:, :]`` at prefill; a strided 3-D input made
    PyTorch broadcast-copy the head's weight per row (1.8 s and +1.8 GiB for a 32-row SmolLM2
    prefill). The engine makes that input contiguous, once however many engines share the model."""
    model, tokenizer = tiny
    head = model.get_output_embeddings()
    seen: list[bool] = []
    probe = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].is_contiguous()))
    engines = [HFEngine(model, tokenizer), HFEngine(model, tokenizer)]
    try:
        hooks = [h for h in head._forward_pre_hooks.values() if h.__qualname__.startswith("contiguous_head")]
        assert len(hooks) == 1
        hidden = torch.randn(3, 5, head.in_features)
        strided = hidden[:, -1:, :]
        assert not strided.is_contiguous()
        with torch.no_grad():
            out = head(strided)
        assert seen[-1] is True
        torch.testing.assert_close(out, hidden[:, -1:, :].contiguous() @ head.weight.T)
        prompts = _prompts(tokenizer, 3)
        seen.clear()
        await asyncio.gather(*(engines[0].generate(p, GREEDY) for p in prompts))
        assert seen and all(seen)
    finally:
        probe.remove()
        for eng in engines:
            await eng.close()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
async def test_top_logprobs_streaming_callback_and_weights_version(tiny, engine, temperature):
    _, tokenizer = tiny
    prompt = _prompts(tokenizer, 1)[0]
    seen: list[tuple[int, float]] = []
    params = SamplingParams(temperature=temperature, max_new_tokens=10, top_logprobs=4, seed=3)
    out = await engine.generate(prompt, params, on_token=lambda tok, lp: seen.append((tok, lp)))
    assert seen == list(zip(out.token_ids, out.logprobs, strict=True))  # every token, as sampled
    assert out.top_logprobs is not None and len(out.top_logprobs) == len(out.token_ids)
    for tok, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs, strict=True):
        assert len(top) == 4 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        ids = [i for i, _ in top]
        if tok in ids:  # the sampled token's logprob is the same number in both lists
            assert lp == pytest.approx(top[ids.index(tok)][1], abs=1e-5)
        assert lp <= top[0][1] + 1e-5
    if temperature == 0.0:
        assert [top[0][0] for top in out.top_logprobs] == out.token_ids
    plain = await engine.generate(prompt, SamplingParams(temperature=temperature, max_new_tokens=10, seed=3))
    assert plain.top_logprobs is None and plain.token_ids == out.token_ids
    assert out.weights_version == engine.weights_version == 0
    engine.update_weights(engine.model)
    again = await engine.generate(prompt, params)
    assert again.weights_version == 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_engine_shares_the_frozen_embedding_and_never_writes_into_it(dtype):
    """Under LoRA the engine's copy holds the trainer's own embedding (113 MB of SmolLM2-135M in
    float32), not a duplicate; a sync from the LoRA policy copies nothing into it; a policy whose
    embedding differs gives the engine its own copy and leaves the trainer's untouched. Under full
    fine-tuning nothing is shared."""
    from horizonrl.engine.config import EngineConfig
    from horizonrl.engine.factory import engine_from_config
    from horizonrl.hardware import cpu_float16_weight_matmuls
    from horizonrl.model_config import ModelConfig
    from horizonrl.models import load_base
    from horizonrl.trainable import build_policy

    if dtype == "float16" and not cpu_float16_weight_matmuls():
        pytest.skip("the float16 copy needs fbgemm's half-precision GEMM (x86 with AVX2)")
    config = ModelConfig(path="tiny-random", dtype="float32")
    loaded = load_base(config)
    base, tokenizer = loaded.base, loaded.tokenizer
    engine = engine_from_config(base, tokenizer, EngineConfig(dtype=dtype), config, 0)
    own = base.get_input_embeddings().weight
    assert engine.model.get_input_embeddings().weight is own  # shared, not copied
    full = engine_from_config(
        base, tokenizer, EngineConfig(dtype=dtype), config.model_copy(update={"finetune": "full"}), 0
    )
    assert full.model.get_input_embeddings().weight.data_ptr() != own.data_ptr()

    policy = build_policy(base, config).model  # LoRA on the same base: its embedding is the engine's
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.3)
    ids = torch.tensor([tokenizer.encode("Share what never changes.")])
    engine.update_weights(policy)
    assert engine.model.get_input_embeddings().weight is own
    with torch.no_grad():
        after, merged = engine.model(ids).logits.float(), policy(ids).logits.float()
    assert (after - merged).abs().max() < 1e-2 * max(1.0, float(merged.abs().max()))

    other = load_base(config).base  # another model whose embedding differs: never written into the trainer's
    with torch.no_grad():
        other.get_input_embeddings().weight.add_(1.0)
    before = own.detach().clone()
    engine.update_weights(other)
    assert torch.equal(own, before)
    copied = engine.model.get_input_embeddings().weight
    assert copied is not own and torch.equal(copied, other.get_input_embeddings().weight)
