"""Engines in other processes behind the same Engine contract (token ids in, token ids and their
sampling logprobs out): ``engine.kind: openai`` (any OpenAI-compatible server that returns token
ids, such as a vLLM server or ``horizon serve``) and ``engine.kind: vllm`` (vLLM's async engine in
this process, on a GPU).

**openai.** Each ``generate`` is one ``POST {base_url}/completions`` with the prompt as token ids,
``logprobs: 1`` and ``return_tokens_as_token_ids: true`` (vLLM and ``horizon serve`` then write
each sampled token as ``"token_id:<id>"``); a ``token_ids`` field in the choice is used where the
server gives one. A request's constraint (``SamplingParams.constraint``) travels as vLLM's
``structured_outputs`` field (vLLM and ``horizon serve`` enforce it); a server that refuses it
with a 400 naming that field raises :class:`~horizonrl.engine.constraints.ConstraintError`, as
the in-process engine does, and ``constraint_met`` is read off the finish reason (a reply the
token limit cut is unfinished). The server batches concurrent requests. Weights are synced by
``engine.weight_sync``: ``horizon`` (the policy is written to a directory the server can read and
``POST /v1/horizon/weights`` swaps it in), ``vllm_lora`` (vLLM's ``/v1/load_lora_adapter`` with the
adapter written to disk, served under a new name per version), or ``none`` (the server's weights
are not ours to change: evaluation only).

**vllm.** ``vllm.AsyncLLMEngine`` (or ``vllm.v1`` ``AsyncLLM``) with token prompts and
``logprobs=0`` (the sampled token's logprob); LoRA policies are synced by loading the saved adapter
as a new ``LoRARequest`` per version (full fine-tuning goes through a vLLM server and
``engine.kind: openai``). It needs a GPU and the ``vllm`` package; on a machine without them it
refuses to start with one line saying so.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.constraints import Constraint, ConstraintCompiler, ConstraintError
from horizonrl.engine.weight_sync import (
    LoraVersions,
    Server,
    missed_sync,
    post_json,
    write_policy_adapter,
)
from horizonrl.errors import ConfigError, HorizonError
from horizonrl.policy import AdapterStage

log = logging.getLogger(__name__)


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise HorizonError(
            f"the completion server returned the token {token!r}, not 'token_id:<id>': it must support "
            "return_tokens_as_token_ids (vLLM does, and horizon serve)"
        )
    return int(token.split(":", 1)[1])


class OpenAIEngine:
    """Token-in / token-out through OpenAI-compatible completions endpoints, one server or several
    (see the module doc and :mod:`horizonrl.engine.weight_sync`)."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        tokenizer: Any,
        *,
        api_key: str = "none",
        max_context: int,
        weight_sync: str = "horizon",
        sync_dir: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        keep_versions: int = 2,
    ) -> None:
        import openai

        from horizonrl.tokens import eos_token_ids, pad_token_id

        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ConfigError("engine.kind openai needs at least one server in engine.base_url")
        self.servers = [Server(u) for u in urls]
        self._client_args = {"api_key": api_key, "timeout": timeout_s, "max_retries": max_retries}
        self._clients: dict[str, Any] = {}
        self._client_loop: Any = None
        self._openai = openai
        self.base_url = self.servers[0].url
        self.model = model
        self.served_model = model
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.eos_token_ids = eos_token_ids(tokenizer)
        self.pad_token_id = pad_token_id(tokenizer)
        self.vocab_size = len(tokenizer)
        self.weight_sync = weight_sync
        self.sync_dir = Path(sync_dir) if sync_dir else Path(tempfile.mkdtemp(prefix="horizonrl-sync-"))
        self.weights_version = 0
        self.api_key = api_key
        self.lora = LoraVersions(keep=keep_versions)
        self._constraints: ConstraintCompiler | None = None
        self._stats = {"requests": 0.0, "generated_tokens": 0.0, "prompt_tokens": 0.0, "generate_s": 0.0}

    def client(self, server: Server | None = None) -> Any:
        """The HTTP client of ``server`` (the first by default) on the running event loop (a
        client's connections belong to one loop, and each rollout may run in a new one)."""
        server = server or self.servers[0]
        loop = asyncio.get_running_loop()
        if self._client_loop is not loop:
            self._clients, self._client_loop = {}, loop
        if server.url not in self._clients:
            self._clients[server.url] = self._openai.AsyncOpenAI(base_url=server.url, **self._client_args)
        return self._clients[server.url]

    async def generate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Completion:
        params = params or SamplingParams()
        extra: dict[str, Any] = {"return_tokens_as_token_ids": True}
        if params.seed is not None:
            extra["seed"] = params.seed
        if params.constraint is not None:
            extra["structured_outputs"] = params.constraint.to_structured_outputs()
        server = min(self.servers, key=lambda s: s.in_flight)  # the least busy server
        model, version, synced = self.served_model, self.weights_version, self.weights_version > 0
        start = time.perf_counter()
        server.in_flight += 1
        try:
            reply = await self.client(server).completions.create(
                model=model,
                prompt=[int(t) for t in prompt_ids],
                max_tokens=params.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                stop=list(params.stop) or None,
                logprobs=max(1, params.top_logprobs),
                extra_body=extra,
            )
        except self._openai.BadRequestError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            if params.constraint is not None and body.get("param") == "structured_outputs":
                raise ConstraintError(
                    f"engine.kind openai: {server.url} refused the constraint: {body.get('message')}"
                ) from None
            raise HorizonError(f"engine.kind openai: {server.url} failed a completion: {exc}") from None
        except self._openai.NotFoundError as exc:
            raise missed_sync(server, model, exc) from None
        except self._openai.APIError as exc:
            raise HorizonError(f"engine.kind openai: {server.url} failed a completion: {exc}") from None
        finally:
            server.in_flight -= 1
        if self.weight_sync == "horizon":  # the server says which of its versions sampled this
            reported = server.versions.run_version(getattr(reply, "system_fingerprint", None), synced)
            version = version if reported is None else reported
        choice = reply.choices[0]
        ids = getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids")
        tokens = choice.logprobs.tokens if choice.logprobs is not None else []
        ids = [int(t) for t in ids] if ids else [_token_id(t) for t in tokens]
        logprobs = [float(x) for x in (choice.logprobs.token_logprobs if choice.logprobs else [])]
        if len(logprobs) != len(ids):
            raise HorizonError(
                f"engine.kind openai: {server.url} returned {len(ids)} tokens but {len(logprobs)} logprobs"
            )
        finish = "stop" if choice.finish_reason == "stop" else "length"
        self._stats["requests"] += 1
        self._stats["prompt_tokens"] += len(prompt_ids)
        self._stats["generated_tokens"] += len(ids)
        self._stats["generate_s"] += time.perf_counter() - start
        return Completion(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            weights_version=version,
            constraint_met=None
            if params.constraint is None
            else self._check_enforced(params.constraint, ids),
        )

    def _check_enforced(self, constraint: Constraint, ids: list[int]) -> bool:
        """Whether ``ids`` complete ``constraint``'s language; HorizonError when the server did not
        hold them to it at all (an endpoint that ignores ``structured_outputs`` would otherwise hand
        the trainer tokens whose masks it cannot rebuild)."""
        if self._constraints is None:
            self._constraints = ConstraintCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        matcher = self._constraints.matcher(constraint)
        body = ids[:-1] if ids and ids[-1] in self.eos_token_ids else ids  # llguidance counts no EOS
        if matcher.try_consume_tokens(body) < len(body) or (
            len(body) < len(ids) and not matcher.is_accepting()
        ):
            raise HorizonError(
                f"engine.kind openai: {self.base_url} returned a completion outside the constraint "
                f"({constraint.describe()}): the server does not enforce structured_outputs (vLLM >= 0.10 "
                "and horizon serve do)"
            )
        return bool(matcher.is_accepting())

    def update_weights(self, policy: Any, stages: Sequence[AdapterStage] = ()) -> None:
        """Sync ``policy`` (``stages``: the adapters merged into its base) to every server as
        ``engine.weight_sync`` says (see :mod:`horizonrl.engine.weight_sync`)."""
        if self.weight_sync == "none":
            raise HorizonError(
                "engine.weight_sync is none: the server's weights cannot follow training (use it for evals)"
            )
        version = self.weights_version + 1
        out = self.sync_dir / f"v{version:06d}"
        if self.weight_sync == "horizon":  # the whole policy, merged: right whatever stages it has
            write_plain_model(policy, self.tokenizer, out)
            for server in self.servers:
                reply = post_json(
                    server,
                    "/v1/horizon/weights",
                    {"checkpoint": str(out)},
                    self.api_key,
                    "engine.weight_sync horizon",
                )
                if "policy_version" in reply:
                    server.versions.synced(int(reply["policy_version"]), version)
        else:
            self.served_model = self._load_lora(policy, stages, version, out)
        self.weights_version = version

    def _load_lora(self, policy: Any, stages: Sequence[AdapterStage], version: int, out: Path) -> str:
        """Load the policy's adapter as version ``version`` on every server (the base itself when the
        policy is the base), unload versions past the newest ``keep``; the model name to request."""
        what = "engine.weight_sync vllm_lora"
        if write_policy_adapter(out, policy, stages, self.model) is None:
            return self.model
        name = self.lora.name(version)
        loaded: list[Server] = []
        try:
            for server in self.servers:
                post_json(
                    server,
                    "/v1/load_lora_adapter",
                    {"lora_name": name, "lora_path": str(out)},
                    self.api_key,
                    what,
                )
                loaded.append(server)
        except HorizonError:
            for server in loaded:  # nothing half-synced: the others serve the previous version
                self._unload(server, name)
            raise
        for old in self.lora.add(version):
            if not all([self._unload(server, self.lora.name(old)) for server in self.servers]):
                self.lora.retry.add(old)
        return name

    def _unload(self, server: Server, name: str) -> bool:
        try:
            post_json(server, "/v1/unload_lora_adapter", {"lora_name": name}, self.api_key, "unload")
        except HorizonError as exc:
            if "(404)" in str(exc):  # not loaded there (any more): nothing to free
                return True
            log.warning("%s", exc)
            return False
        return True

    def drop_caches(self) -> None:
        return None

    @property
    def stats(self) -> dict[str, float]:
        s = dict(self._stats)
        s["tokens_per_s"] = s["generated_tokens"] / s["generate_s"] if s["generate_s"] else 0.0
        s["weights_version"] = float(self.weights_version)
        return s

    async def close(self) -> None:
        if self._client_loop is asyncio.get_running_loop():
            for client in self._clients.values():
                await client.close()
        self._clients, self._client_loop = {}, None


class VLLMEngine:
    """vLLM's async engine in this process (GPU), token-in / token-out (see the module doc)."""

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        *,
        max_context: int,
        gpu_memory_utilization: float = 0.85,
        enable_lora: bool = True,
        max_lora_rank: int = 64,
        seed: int = 0,
    ) -> None:
        try:
            import torch
            import vllm
        except ImportError:
            raise ConfigError(
                "engine.kind vllm needs the vllm package (pip install vllm) and a GPU"
            ) from None
        if not torch.cuda.is_available():
            raise ConfigError("engine.kind vllm needs a GPU; this machine has none (use engine.kind hf)")
        from horizonrl.tokens import eos_token_ids, pad_token_id

        args = vllm.AsyncEngineArgs(
            model=model_path,
            max_model_len=max_context,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_lora=enable_lora,
            max_lora_rank=max_lora_rank,
            enable_prefix_caching=True,
        )
        self._vllm = vllm
        self.model_path = model_path
        self.max_lora_rank = max_lora_rank
        self.engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.eos_token_ids = eos_token_ids(tokenizer)
        self.pad_token_id = pad_token_id(tokenizer)
        self.vocab_size = len(tokenizer)
        self.weights_version = 0
        self._lora: Any = None
        self._sync_dir = Path(tempfile.mkdtemp(prefix="horizonrl-vllm-"))
        self._counter = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Completion:
        params = params or SamplingParams()
        sampling = self._vllm.SamplingParams(**vllm_sampling_kwargs(params), **self._structured(params))
        self._counter += 1
        final = None
        version, lora = self.weights_version, self._lora
        async for out in self.engine.generate(
            {"prompt_token_ids": list(prompt_ids)},
            sampling,
            request_id=f"h{self._counter}",
            lora_request=lora,
        ):
            final = out
        if final is None:
            raise HorizonError("engine.kind vllm: the engine returned no output for a request")
        return completion_from_vllm(final, version, params.top_logprobs)

    def _structured(self, params: SamplingParams) -> dict[str, Any]:
        """vLLM's keyword for ``params.constraint``: ``structured_outputs`` (vLLM >= 0.10) or
        ``guided_decoding`` (older releases), with the same fields as the server's
        ``structured_outputs``; a vLLM with neither refuses the constraint (one line)."""
        if params.constraint is None:
            return {}
        fields = params.constraint.to_structured_outputs()
        module = self._vllm.sampling_params
        if hasattr(module, "StructuredOutputsParams"):
            return {"structured_outputs": module.StructuredOutputsParams(**fields)}
        if hasattr(module, "GuidedDecodingParams"):
            return {"guided_decoding": module.GuidedDecodingParams(**fields)}
        raise ConstraintError(
            f"engine.kind vllm: this vLLM ({getattr(self._vllm, '__version__', '?')}) has no structured "
            "outputs; constrained requests need vLLM >= 0.6 (guided decoding) or >= 0.10"
        )

    def update_weights(self, policy: Any, stages: Sequence[AdapterStage] = ()) -> None:
        """The policy's adapter (its stages and its own, concatenated: see
        :mod:`horizonrl.engine.weight_sync`) loaded as a new ``LoRARequest`` per version; requests in
        flight finish on the one they started with. Full weights are not synced into an in-process
        vLLM engine: serve the policy with a vLLM server and ``engine.kind: openai`` instead, or train
        LoRA."""
        if not hasattr(policy, "peft_config") and not stages:  # full weights, or the base itself
            raise ConfigError(
                "engine.kind vllm syncs LoRA policies only (model.finetune lora); for full fine-tuning run a "
                "vLLM server and use engine.kind openai"
            )
        version = self.weights_version + 1
        out = self._sync_dir / f"v{version:06d}"
        adapter = write_policy_adapter(out, policy, stages, self.model_path)
        if adapter is not None:
            rank = int(adapter.config["r"])
            if rank > self.max_lora_rank:
                raise ConfigError(
                    f"engine.kind vllm: the policy's adapter has rank {rank} (its stages' ranks added up), "
                    f"above vLLM's max_lora_rank {self.max_lora_rank}; lower model.lora_r or sft's rank"
                )
            self._lora = self._vllm.lora.request.LoRARequest(f"policy-v{version}", version, str(out))
        else:
            self._lora = None
        self.weights_version = version

    def drop_caches(self) -> None:
        return None

    @property
    def stats(self) -> dict[str, float]:
        return {"weights_version": float(self.weights_version)}


def vllm_sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """``vllm.SamplingParams``' keywords for ``params`` (the constraint aside): vLLM's
    ``logprobs=k`` returns the sampled token's logprob and the k most likely."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop) or None,
        "seed": params.seed,
        "logprobs": max(0, params.top_logprobs),
    }


def completion_from_vllm(output: Any, version: int, top_logprobs: int) -> Completion:
    """A vLLM ``RequestOutput`` as a Completion: the first sequence's token ids, each one's logprob
    (from the ``{token id: Logprob}`` dict of its position), and, when asked for, the
    ``top_logprobs`` most likely tokens of each position by their ``rank`` (the sampled token
    appears among them only when it is one of the k)."""
    seq = output.outputs[0]
    ids = [int(t) for t in seq.token_ids]
    steps = list(seq.logprobs or [])
    if len(steps) != len(ids):
        raise HorizonError(f"engine.kind vllm: {len(ids)} tokens but {len(steps)} positions of logprobs")
    logprobs = [float(step[tok].logprob) for step, tok in zip(steps, ids, strict=True)]
    top = None
    if top_logprobs > 0:
        top = []
        for step in steps:
            ranked = sorted(
                ((int(t), lp) for t, lp in step.items() if lp.rank is not None and lp.rank <= top_logprobs),
                key=lambda item: item[1].rank,
            )
            top.append([(t, float(lp.logprob)) for t, lp in ranked[:top_logprobs]])
    finish = "length" if seq.finish_reason == "length" else "stop"
    return Completion(
        token_ids=ids, logprobs=logprobs, finish_reason=finish, top_logprobs=top, weights_version=version
    )


def write_plain_model(policy: Any, tokenizer: Any, out: Path) -> None:
    """``policy`` (a LoRA adapter merged weight by weight) as a plain transformers model directory."""
    from safetensors.torch import save_file

    from horizonrl.engine.weights import plain_state_dict

    out.mkdir(parents=True, exist_ok=False)
    model = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    state = plain_state_dict(policy)
    data_ptrs: dict[int, str] = {}
    for key in list(state):  # tied weights (the output head) are saved once, as transformers does
        ptr = state[key].data_ptr()
        if ptr in data_ptrs:
            del state[key]
        else:
            data_ptrs[ptr] = key
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
