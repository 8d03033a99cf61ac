"""The engine a recipe's ``engine:`` block (:class:`~horizonrl.engine.config.EngineConfig`) asks
for, built from that block, the ``model:`` block and the run's seed: in this process
(:func:`engine_from_config`) or inside a Ray engine replica (:func:`replica_engine`); and the
process-wide memory settings the block sets (:func:`apply_memory_settings`)."""

from __future__ import annotations

from typing import Any

from horizonrl.engine.config import EngineConfig
from horizonrl.engine.fast_copy import FAST_KINDS, fast_sampler_model
from horizonrl.engine.hf import HFEngine
from horizonrl.engine.weights import frozen_weights, sampler_model
from horizonrl.hardware import resolve_sampler_dtype
from horizonrl.memory import map_large_blocks
from horizonrl.model_config import ModelConfig
from horizonrl.models import context_length, load_base


def apply_memory_settings(engine: EngineConfig) -> None:
    """Process-wide allocator settings the config asks for (``engine.mmap_threshold_mib``)."""
    if engine.mmap_threshold_mib > 0:
        map_large_blocks(int(engine.mmap_threshold_mib * 2**20))


def engine_from_config(base: Any, tokenizer: Any, engine: EngineConfig, model: ModelConfig, seed: int) -> Any:
    """The sampling engine ``engine`` asks for. ``hf``: an in-process :class:`HFEngine` with its own
    copy of ``base``'s weights in ``engine.dtype``, the run's ``seed`` and the model's context length
    (``model.max_context`` or the model's own). ``openai`` / ``vllm``: :mod:`horizonrl.engine.remote`
    (the server or vLLM holds the weights; ``base`` only gives the context length)."""
    if engine.kind == "openai":
        import os

        from horizonrl.engine.remote import OpenAIEngine

        return OpenAIEngine(
            engine.base_url,
            str(engine.served_model),
            tokenizer,
            api_key=os.environ.get(engine.api_key_env, "none"),
            max_context=context_length(base, model),
            weight_sync=engine.weight_sync,
            sync_dir=str(engine.sync_dir) if engine.sync_dir else None,
        )
    if engine.kind == "vllm":
        from horizonrl.engine.remote import VLLMEngine
        from horizonrl.models import resolved_model_path

        return VLLMEngine(
            resolved_model_path(model.path),
            tokenizer,
            max_context=context_length(base, model),
            gpu_memory_utilization=engine.gpu_memory_utilization,
            seed=seed,
        )
    dtype = resolve_sampler_dtype(engine.dtype, str(next(base.parameters()).device))
    # the weights the trainer never changes are shared with the engine's copy, not duplicated
    shared = frozen_weights(base, model.finetune, model.lora.target_modules)
    return HFEngine(
        fast_sampler_model(base, tokenizer, dtype, shared)
        if dtype in FAST_KINDS
        else sampler_model(base, dtype, shared=shared),
        tokenizer,
        max_batch_size=engine.max_batch_size,
        batch_wait_s=engine.batch_wait_s,
        prefix_cache_mib=engine.prefix_cache_mib,
        continuous_batching=engine.continuous_batching,
        seed=seed,
        max_context=context_length(base, model),
    )


def replica_engine(engine: EngineConfig, model: ModelConfig, seed: int, device: str) -> Any:
    """The engine of one Ray engine replica, built inside its actor (handed to it as
    ``partial(replica_engine, ...)``, which pickles): ``model``'s base on ``device`` (the GPU the
    replica reserved, or the CPU) and the engine ``engine`` asks for."""
    apply_memory_settings(engine)
    loaded = load_base(model.model_copy(update={"device": device}))
    return engine_from_config(loaded.base, loaded.tokenizer, engine, model, seed)
