"""The recipe's ``engine:`` block: the inference engine every command samples from (built by
:mod:`horizonrl.engine.factory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineConfig(BaseModel):
    """The inference engine: in-process (``hf``), an OpenAI-compatible server that returns token ids
    (``openai``), or vLLM on a GPU (``vllm``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["hf", "openai", "vllm"] = Field(
        "hf",
        description="'hf': the in-process engine (CPU or GPU). 'openai': a server that answers token-id "
        "completions with logprobs (a vLLM server, horizon serve). 'vllm': vLLM's async engine on a GPU.",
    )
    base_url: str | list[str] | None = Field(
        None,
        description="openai: the server, e.g. http://gpu-node:8000/v1, or a list of servers: every one gets "
        "every weights version, and requests go to the least busy (list each server, not a load balancer "
        "in front of them).",
    )
    served_model: str | None = Field(None, description="openai: the model id the server serves.")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: the variable holding the server's key.")
    weight_sync: Literal["horizon", "vllm_lora", "none"] = Field(
        "horizon",
        description="openai: how trained weights reach the server — 'horizon' (horizon serve's weights "
        "endpoint, the whole merged policy), 'vllm_lora' (vLLM's load_lora_adapter, a new adapter name "
        "per version), 'none' (evaluation only).",
    )
    sync_dir: Path | None = Field(
        None, description="openai/vllm: where synced weights are written (a directory the server can read)."
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vllm: share of GPU memory it may use."
    )
    max_batch_size: int = Field(32, ge=1, le=4_096, description="Most generation requests decoded together.")
    batch_wait_s: float = Field(
        0.005, ge=0.0, description="How long the engine waits for more requests after the first arrives."
    )
    dtype: Literal["auto", "float32", "bfloat16", "int8", "float16", "fast"] = Field(
        "bfloat16",
        description="Weights dtype of the sampling model in every command; 'auto' = model.dtype; 'int8': "
        "int8 linear layers on a CPU with int8 dot products (VNNI or AMX; refused elsewhere); "
        "'float16': float16 weights through fbgemm's half-precision GEMM on an x86 CPU with AVX2 "
        "(float32 arithmetic); 'fast': int8 where the CPU has int8 dot products, else float16 where "
        "fbgemm runs, else 'auto' (the trainer stays exact; the fast copies serve no per-row "
        "adapters; summary.json's precision.sampler records the choice). During "
        "training the engine holds its own copy in this dtype, refreshed from the policy after every "
        "optimizer step; eval and rollout build theirs the same way, so a reloaded policy samples as the "
        "run did "
        "(bfloat16 decoding measured 3.4x faster than float32 on a 2-core AVX512-BF16 CPU).",
    )
    prefix_cache_mib: float = Field(
        384,
        ge=0,
        description="MiB of KV cache kept from finished requests, so the next turn of a conversation "
        "prefills only its new tokens (0 turns it off). SmolLM2-135M's keys and values take 23 KB a token "
        "in bfloat16 (384 MiB: 17k tokens), 46 KB in float32.",
    )
    mmap_threshold_mib: float = Field(
        0.0,
        ge=0.0,
        description="Allocations of at least this many MiB get their own mmap, returned to the OS when "
        "freed (glibc's mallopt M_MMAP_THRESHOLD, fixed). 0 keeps glibc's sliding threshold. 1 bounds a "
        "long run's memory: measured on a 100-episode eval, peak 3.54 -> 2.82 GiB for 15% more time.",
    )
    continuous_batching: bool = Field(
        True,
        description="Requests that arrive while a batch decodes join it at the next token, and each request "
        "is answered as soon as its row finishes (off: static batches; a request waits for the running "
        "batch to end).",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "prefix_cache_tokens" in data:
            raise ValueError(
                "engine.prefix_cache_tokens is now engine.prefix_cache_mib, a budget in MiB "
                "(SmolLM2-135M: 23 KB a token in bfloat16, 46 KB in float32; 384 MiB by default)"
            )
        return data

    @model_validator(mode="after")
    def _kind_fields(self) -> EngineConfig:
        if self.kind == "openai" and not (self.base_url and self.served_model):
            raise ValueError("engine.kind openai needs engine.base_url and engine.served_model")
        if self.kind != "openai" and (self.base_url or self.served_model):
            raise ValueError("engine.base_url and engine.served_model are for engine.kind openai")
        urls = [self.base_url] if isinstance(self.base_url, str) else list(self.base_url or [])
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"engine.base_url: {url!r} is not an http(s) URL (e.g. http://gpu-node:8000/v1)"
                )
        if len(set(urls)) < len(urls):
            raise ValueError("engine.base_url lists a server twice; list each server once")
        return self
