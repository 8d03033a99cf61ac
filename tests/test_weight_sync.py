"""Weight sync that is right whatever stages the policy has (engine/weight_sync.py): the adapter a
LoRA sync ships carries the SFT stage merged into the trainer's base, versions are named and
unloaded, a server's own weight versions map to the run's, and the vLLM engine's request building
and result mapping read vLLM's output structures (no vLLM here: outputs built in vLLM's shapes —
``RequestOutput.outputs[0]`` with ``token_ids``, ``logprobs`` as one ``{token id: Logprob(logprob,
rank, decoded_token)}`` per position, ``finish_reason`` — as vllm/outputs.py and vllm/logprobs.py
define them)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from horizonrl.config import load_config
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.remote import completion_from_vllm, vllm_sampling_kwargs
from horizonrl.engine.weight_sync import LoraVersions, ServerVersions, policy_adapter
from horizonrl.errors import ConfigError, HorizonError
from horizonrl.models import load_base
from horizonrl.policy import stage_from_peft, write_adapter
from horizonrl.trainable import wrap_lora

TINY = ["model.path=tiny-random", "model.dtype=float32", "engine.dtype=float32"]


def _randomize_lora(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def test_the_lora_sync_ships_the_sft_stage_with_the_rl_adapter(tmp_path):
    """Served base + shipped adapter == the trainer's policy (SFT merged into its base + RL adapter);
    the RL adapter alone, what the sync shipped before, is a different policy."""
    from peft import PeftModel

    config = load_config("configs/calc.yaml", TINY)
    original = load_base(config.model).base.eval()
    sft = wrap_lora(copy.deepcopy(original), config.model.lora)
    _randomize_lora(sft, 1)
    sft_stage = stage_from_peft(sft, "sft")
    merged = sft.merge_and_unload()
    policy = wrap_lora(merged, config.model.lora)  # the RL adapter on the SFT-merged base
    _randomize_lora(policy, 2)
    ids = torch.tensor([[1, 5, 9, 22, 7, 3, 11, 4]])
    with torch.no_grad():
        trainer = policy(input_ids=ids).logits

    shipped = policy_adapter(policy, [sft_stage])
    assert shipped is not None and shipped.config["r"] == 2 * config.model.lora.r
    write_adapter(tmp_path / "stack", shipped, "tiny")
    served = PeftModel.from_pretrained(copy.deepcopy(original), tmp_path / "stack").eval()
    with torch.no_grad():
        assert torch.allclose(served(input_ids=ids).logits, trainer, atol=1e-4)

    write_adapter(tmp_path / "top", policy_adapter(policy, []), "tiny")  # the RL adapter alone
    top_only = PeftModel.from_pretrained(copy.deepcopy(original), tmp_path / "top").eval()
    with torch.no_grad():
        assert not torch.allclose(top_only(input_ids=ids).logits, trainer, atol=1e-2)
    assert policy_adapter(original, []) is None  # the base itself: nothing to ship


def test_lora_versions_keep_the_newest_and_retry_refused_unloads():
    versions = LoraVersions(keep=2, token="abc")
    assert versions.name(3) == "policy-abc-v3" and versions.version_of("policy-abc-v3") == 3
    assert versions.version_of("policy-other-v3") is None
    assert versions.add(1) == [] and versions.add(2) == []
    assert versions.add(3) == [1]
    versions.retry.add(1)  # a server refused to unload it (in use): tried again after the next sync
    assert versions.add(4) == [1, 2]
    assert versions.loaded == [3, 4]
    with pytest.raises(ValueError):
        LoraVersions(keep=0)


def test_a_server_version_this_run_did_not_sync_is_an_error():
    server = ServerVersions("http://127.0.0.1:1/v1")
    assert server.run_version(None, synced_any=False) is None  # not horizon serve: no version reported
    assert server.run_version("horizonrl-w5", synced_any=False) == 0  # before any sync: the run's 0
    server.synced(6, 1)
    assert server.run_version("horizonrl-w5", synced_any=True) == 0  # in flight during the sync
    assert server.run_version("horizonrl-w6", synced_any=True) == 1
    with pytest.raises(HorizonError, match="weights version 9, which this run did not sync"):
        server.run_version("horizonrl-w9", synced_any=True)
    fresh = ServerVersions("http://127.0.0.1:2/v1")  # restarted after the run synced: version 0 again
    with pytest.raises(HorizonError, match="restarted"):
        fresh.run_version("horizonrl-w0", synced_any=True)


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def test_vllm_request_building_and_result_mapping():
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=3, seed=11, top_logprobs=2)
    assert vllm_sampling_kwargs(params) == {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 3,
        "stop": None,
        "seed": 11,
        "logprobs": 2,
    }
    # logprobs=2: each position holds the sampled token and the 2 most likely (the sampled one may
    # be among them, or ranked below them, as at position 1)
    steps = [
        {5: Logprob(-0.1, 1, "a"), 8: Logprob(-2.5, 2, "b")},
        {9: Logprob(-3.0, 4, "c"), 2: Logprob(-0.4, 1, "d"), 7: Logprob(-1.4, 2, "e")},
        {0: Logprob(-0.01, 1, "</s>"), 4: Logprob(-5.0, 2, "f")},
    ]
    output = SimpleNamespace(
        outputs=[SimpleNamespace(token_ids=[5, 9, 0], logprobs=steps, finish_reason="stop")]
    )
    done = completion_from_vllm(output, version=3, top_logprobs=2)
    assert done.token_ids == [5, 9, 0] and done.logprobs == [-0.1, -3.0, -0.01]
    assert done.top_logprobs == [[(5, -0.1), (8, -2.5)], [(2, -0.4), (7, -1.4)], [(0, -0.01), (4, -5.0)]]
    assert done.finish_reason == "stop" and done.weights_version == 3
    plain = completion_from_vllm(output, version=0, top_logprobs=0)
    assert plain.top_logprobs is None
    cut = SimpleNamespace(
        outputs=[SimpleNamespace(token_ids=[5], logprobs=steps[:1], finish_reason="length")]
    )
    assert completion_from_vllm(cut, 0, 0).finish_reason == "length"
    broken = SimpleNamespace(
        outputs=[SimpleNamespace(token_ids=[5, 9], logprobs=steps[:1], finish_reason="stop")]
    )
    with pytest.raises(HorizonError, match="2 tokens but 1 positions"):
        completion_from_vllm(broken, 0, 0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [
                "engine.kind=openai",
                "engine.base_url=http://a:1/v1",
                "engine.served_model=m",
                "engine.weight_sync=vllm_lora",
                "model.finetune=full",
            ],
            "engine.weight_sync vllm_lora syncs LoRA adapters, and model.finetune is 'full'",
        ),
        (["engine.kind=vllm", "model.finetune=full"], "engine.kind vllm syncs LoRA adapters"),
        (
            ["engine.kind=openai", "engine.base_url=[http://a:1/v1,ftp://b/v1]", "engine.served_model=m"],
            "'ftp://b/v1' is not an http",
        ),
        (
            ["engine.kind=openai", "engine.base_url=[http://a:1/v1,http://a:1/v1]", "engine.served_model=m"],
            "lists a server twice",
        ),
    ],
)
def test_sync_settings_that_cannot_work_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config("configs/calc.yaml", [*TINY, *overrides])


# ------------------------------------------------------------------ against real horizon serve processes
SERVED = [*TINY, "sampling.max_new_tokens=12", "name=served"]
TOKEN = "sync-token"
PROMPTS = [[1, 5, 9, 22, 7, 3], [4, 4, 17, 30, 2], [8, 1, 64, 12, 5, 5, 9]]


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    from contextlib import ExitStack

    from horizonrl.serve.server import serve_in_subprocess

    root = tmp_path_factory.mktemp("sync")
    with ExitStack() as stack:
        urls = [
            stack.enter_context(
                serve_in_subprocess("configs/calc.yaml", SERVED, token=TOKEN, checkpoint_roots=[str(root)])
            )[0]
            for _ in range(2)
        ]
        yield urls, root


def _greedy_in_process(model, tokenizer, prompts):
    import asyncio

    from horizonrl.engine.hf import HFEngine

    engine = HFEngine(model, tokenizer, max_batch_size=8, seed=0)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)

    async def go():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    return asyncio.run(go())


def _greedy_served(url, model_name, prompts):
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=120)
    out = []
    for p in prompts:
        reply = client.completions.create(
            model=model_name,
            prompt=p,
            max_tokens=12,
            temperature=0.0,
            logprobs=1,
            extra_body={"return_tokens_as_token_ids": True},
        )
        choice = reply.choices[0]
        out.append(
            ([int(t.split(":", 1)[1]) for t in choice.logprobs.tokens], choice.logprobs.token_logprobs)
        )
    return out


def _served_models(url):
    import httpx

    reply = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    return [m["id"] for m in reply.json()["data"]]


def test_every_server_serves_the_trainers_policy_after_each_sync(two_servers):
    """SFT, then two RL steps, synced with vllm_lora to two horizon serve processes: after each sync
    both servers' greedy completions are the in-process policy's (tokens identical, logprobs within
    float32 rounding), older versions are unloaded, and a server that missed a version is an error."""
    import asyncio

    from horizonrl.engine.remote import OpenAIEngine

    urls, root = two_servers
    config = load_config("configs/calc.yaml", TINY)
    loaded = load_base(config.model)
    original, tokenizer = loaded.base.eval(), loaded.tokenizer
    engine = OpenAIEngine(
        [f"{u}/v1" for u in urls],
        "served",
        tokenizer,
        api_key=TOKEN,
        max_context=2048,
        weight_sync="vllm_lora",
        sync_dir=str(root / "run"),
    )

    def check(policy, stages, version):
        engine.update_weights(policy, stages)
        assert engine.weights_version == version
        plain = copy.deepcopy(policy).merge_and_unload() if hasattr(policy, "peft_config") else policy
        want = _greedy_in_process(plain.eval(), tokenizer, PROMPTS)
        for url in urls:
            got = _greedy_served(url, engine.served_model, PROMPTS)
            for mine, (ids, lps) in zip(want, got, strict=True):
                assert ids == mine.token_ids, (url, version)
                assert lps == pytest.approx(mine.logprobs, abs=1e-3)
        done = asyncio.run(engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=12)))
        assert done.weights_version == version and done.token_ids == want[0].token_ids

    sft = wrap_lora(copy.deepcopy(original), config.model.lora)  # SFT: its adapter merged into the base
    _randomize_lora(sft, 1)
    stages = [stage_from_peft(sft, "sft")]
    base = sft.merge_and_unload()
    check(base, stages, 1)
    policy = wrap_lora(base, config.model.lora)  # RL on top of the SFT-merged base
    _randomize_lora(policy, 2)
    check(policy, stages, 2)
    _randomize_lora(policy, 3)
    check(policy, stages, 3)
    for url in urls:  # the newest two stay loaded
        assert [m for m in _served_models(url) if m.startswith(f"policy-{engine.lora.token}-")] == [
            engine.lora.name(2),
            engine.lora.name(3),
        ]
    # a server that missed a version (here: it was unloaded behind the run's back) is an error
    import httpx

    httpx.post(
        f"{urls[1]}/v1/unload_lora_adapter",
        json={"lora_name": engine.served_model},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    ).raise_for_status()
    engine.servers[0].in_flight = 10  # steer the next request to the second server

    with pytest.raises(HorizonError, match="missed a weight sync"):
        asyncio.run(engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=4)))
    engine.servers[0].in_flight = 0


def test_horizon_train_syncs_sft_and_rl_steps_to_two_servers(two_servers, tmp_path, monkeypatch):
    """``horizon train`` (SFT, then two RL steps) with engine.kind openai and vllm_lora against two
    servers: each step samples the version synced before it (SFT's is 1), nothing is stale, and the
    final policy reloaded from disk is what both servers serve."""
    import json
    import subprocess
    import sys

    from horizonrl.policy import read_manifest

    urls, root = two_servers
    before = {url: set(_served_models(url)) for url in urls}  # what other tests left loaded
    run = [
        *TINY,
        "sampling.max_new_tokens=12",
        "agent.max_turns=4",
        f"output_dir={tmp_path}",
        "name=synced",
        "sft.num_demos=4",
        "train.steps=2",
        "train.tasks_per_step=2",
        "train.group_size=2",
        "eval.num_tasks=4",
        "engine.kind=openai",
        f"engine.base_url=[{urls[0]}/v1,{urls[1]}/v1]",
        "engine.served_model=served",
        "engine.weight_sync=vllm_lora",
        f"engine.sync_dir={root}/train",
        "engine.api_key_env=SYNC_KEY",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", "train", "configs/calc.yaml", *run],
        env={**__import__("os").environ, "SYNC_KEY": TOKEN},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = tmp_path / "synced"
    for step in (1, 2):
        records = [
            json.loads(x) for x in (run_dir / f"trajectories/step_{step:06d}.jsonl").read_text().splitlines()
        ]
        versions = {r["metrics"].get("policy_version_min") for r in records}
        assert versions == {float(step)}, (step, versions)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m.get("staleness/stale", 0) == 0 for m in metrics)
    manifest = read_manifest(run_dir / "policy")
    assert manifest.kind == "lora" and len(manifest.stages) == 2  # SFT and RL: what was shipped
    served = [m for m in _served_models(urls[0]) if m not in before[urls[0]]]
    assert served == [m for m in _served_models(urls[1]) if m not in before[urls[1]]] and len(served) == 2
    from peft import PeftModel

    final = PeftModel.from_pretrained(
        load_base(load_config("configs/calc.yaml", TINY).model).base, run_dir / "policy"
    )
    want = _greedy_in_process(
        final.merge_and_unload().eval(),
        load_base(load_config("configs/calc.yaml", TINY).model).tokenizer,
        PROMPTS,
    )
    newest = max(served, key=lambda name: int(name.rsplit("-v", 1)[1]))
    for url in urls:
        assert [ids for ids, _ in _greedy_served(url, newest, PROMPTS)] == [w.token_ids for w in want]


def test_a_sync_a_server_refuses_is_one_line_naming_it(two_servers):
    """A server that refuses a version (here: a wrong token) stops the sync with one line naming the
    server and its reason; the engine's version and served model stay as they were."""
    from horizonrl.engine.remote import OpenAIEngine

    urls, root = two_servers
    config = load_config("configs/calc.yaml", TINY)
    loaded = load_base(config.model)
    engine = OpenAIEngine(
        [f"{u}/v1" for u in urls],
        "served",
        loaded.tokenizer,
        api_key=TOKEN,
        max_context=2048,
        weight_sync="vllm_lora",
        sync_dir=str(root / "refused"),
    )
    policy = wrap_lora(loaded.base, config.model.lora)
    _randomize_lora(policy, 5)
    engine.api_key = "wrong"
    with pytest.raises(
        HorizonError, match=r"vllm_lora: http://127\.0\.0\.1:\d+/v1/load_lora_adapter refused it \(401\)"
    ) as refused:
        engine.update_weights(policy)
    assert "\n" not in str(refused.value)  # one line
    assert engine.weights_version == 0 and engine.served_model == "served"
