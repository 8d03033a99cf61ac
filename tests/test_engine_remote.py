"""Engines in other processes behind the Engine contract: ``engine.kind: openai`` against a real
``horizon serve`` (token ids and logprobs over HTTP, weight sync through the server's weights
endpoint), and ``engine.kind: vllm``, which needs a GPU and the vllm package."""

from __future__ import annotations

import asyncio

import pytest
import torch

from horizonrl.config import load_config
from horizonrl.envs.factory import make_tasks
from horizonrl.errors import ConfigError
from horizonrl.models import load_base
from horizonrl.rollout.runner import run_rollouts
from horizonrl.serve.server import serve_in_subprocess
from horizonrl.train.runtime import build_runtime

TINY = [
    "model.path=tiny-random",
    "model.dtype=float32",
    "engine.dtype=float32",
    "sampling.max_new_tokens=12",
    "sampling.temperature=0",
    "agent.max_turns=3",
    "agent.max_malformed=3",
]


@pytest.fixture(scope="module")
def server():
    with serve_in_subprocess("configs/calc.yaml", [*TINY, "name=served"], token="k") as (url, _):
        yield url


def _rollouts(config):
    runtime = build_runtime(config)
    tasks = make_tasks(config.env, "train", 4, 0)
    try:
        return runtime, list(
            asyncio.run(run_rollouts(runtime.agent, runtime.backend.env_factory(), tasks, 1, 4))
        )
    except BaseException:
        runtime.close()
        raise


def test_the_openai_engine_samples_the_same_tokens_as_the_in_process_one(server, monkeypatch):
    monkeypatch.setenv("SERVE_KEY", "k")
    remote = [
        *TINY,
        "engine.kind=openai",
        f"engine.base_url={server}/v1",
        "engine.served_model=served",
        "engine.api_key_env=SERVE_KEY",
    ]
    local_rt, local = _rollouts(load_config("configs/calc.yaml", TINY))
    local_rt.close()
    remote_rt, via_http = _rollouts(load_config("configs/calc.yaml", remote))
    try:
        for a, b in zip(local, via_http, strict=True):
            assert a.response_ids == b.response_ids and a.loss_mask == b.loss_mask, b.error
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        engine = remote_rt.engine
        assert engine.stats["requests"] == sum(t.num_turns for t in via_http)
        # weight sync: the trained policy (a LoRA around the base) goes to the server, merged
        from horizonrl.trainable import wrap_lora

        config = load_config("configs/calc.yaml", TINY)
        policy = wrap_lora(load_base(config.model).base, config.model.lora)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
        engine.update_weights(policy)
        assert engine.weights_version == 1
        tasks = make_tasks(config.env, "train", 4, 0)
        after = list(asyncio.run(run_rollouts(remote_rt.agent, remote_rt.backend.env_factory(), tasks, 1, 4)))
        assert [t.response_ids for t in after] != [t.response_ids for t in via_http]
        assert all(t.metrics.get("policy_version_min") == 1.0 for t in after), [
            (t.finish, t.error, t.metrics) for t in after
        ]
    finally:
        remote_rt.close()


def test_engine_kind_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"needs engine\.base_url"):
        load_config("configs/calc.yaml", ["engine.kind=openai"])
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the vllm refusal below is for machines without one")
    with pytest.raises(ConfigError, match="vllm"):
        build_runtime(load_config("configs/calc.yaml", [*TINY, "engine.kind=vllm"]))


def test_vllm_engine_on_a_gpu():
    """vLLM's sampled tokens and logprobs against teacher forcing of the same tokens by the trainer's
    model (float32), and its top logprobs ranked, the most likely first."""
    if not torch.cuda.is_available():
        pytest.skip("engine.kind vllm needs a GPU; this machine has none (run on a GPU machine to test it)")
    pytest.importorskip("vllm", reason="engine.kind vllm needs the vllm package")
    from horizonrl.engine.base import SamplingParams

    config = load_config("configs/calc.yaml", [*TINY, "engine.kind=vllm", "model.path=smollm2-135m"])
    runtime, trajs = _rollouts(config)
    try:
        assert all(sum(t.loss_mask) > 0 and len(t.logprobs) == len(t.response_ids) for t in trajs)
        prompt = runtime.tokenizer("Compute 17 * 23 with the calculator.")["input_ids"]
        params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3, top_logprobs=3)
        done = asyncio.run(runtime.engine.generate(prompt, params))
    finally:
        runtime.close()
    model = load_base(config.model.model_copy(update={"dtype": "float32"})).base.eval()
    ids = torch.tensor([prompt + done.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    forced = torch.log_softmax(logits, dim=-1)
    expected = forced.gather(1, torch.tensor(done.token_ids)[:, None])[:, 0]
    diff = (torch.tensor(done.logprobs) - expected).abs()
    assert diff.mean() < 0.05 and diff.max() < 0.5, diff  # vLLM samples in bfloat16
    assert done.top_logprobs is not None and len(done.top_logprobs) == len(done.token_ids)
    for top, row in zip(done.top_logprobs, forced, strict=True):
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert top[0][0] == int(row.argmax()) or abs(top[0][1] - float(row.max())) < 0.1
