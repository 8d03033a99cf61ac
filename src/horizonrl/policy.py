"""The policy artifact: what a run's checkpoints and its final ``policy/`` hold, and how it loads.

A trained policy is one directory that says what it is (``horizonrl_policy.json``) and loads three
ways to the same logits: ``horizon eval|rollout --checkpoint``, ``transformers``
(``AutoModelForCausalLM.from_pretrained``) and ``peft`` (``PeftModel.from_pretrained`` on its
recorded base). Its forms:

- ``lora``: one PEFT LoRA adapter of the *real* base (``base_model_name_or_path``). A run that
  warm-starts with SFT trains its RL adapter on the base with the SFT adapter merged in; the root
  adapter is the two concatenated along the rank (rank r_sft + r_rl, each scaled into B), whose
  delta is exactly the sum of theirs, so it needs no merged model. The adapters as trained are kept
  under ``stages/`` and HorizonRL's own loader replays them (merge the first into the base, apply
  the second), bit for bit the weights the run sampled its evals from.
- ``full``: the fine-tuned model's own weights (``config.json``, safetensors).

The manifest records the base (the path given, the directory it resolved to, a fingerprint of its
weights, its shape, a fingerprint of its tokenizer); a base or tokenizer that does not match is an
error, as is an adapter whose tensors do not fit the model it is applied to.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from horizonrl.checksums import file_digests, first_problem
from horizonrl.errors import ModelLoadError, brief
from horizonrl.hf_quiet import quiet_transformers
from horizonrl.io import replace_dir_atomic

MANIFEST = "horizonrl_policy.json"
FORMAT = 1
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
STAGES_DIR = "stages"
STACK_PREFIX = "horizonrl-stack("  # the recorded base of a stage after the first
_SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")


# ---------------------------------------------------------------------------------------------------
# identities


def weights_fingerprint(model: Any) -> str:
    """sha256 over every weight's name, shape and bfloat16 bits, in name order.

    bfloat16 is the canonical form, so the same base loaded as float32 or bfloat16 has one
    fingerprint. ~0.5 s for SmolLM2-135M."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            canon = tensor.detach().to("cpu", torch.bfloat16).contiguous()
            digest.update(f"{name}:{tuple(canon.shape)};".encode())
            digest.update(memoryview(canon.view(torch.int16).numpy()).cast("B"))
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 over the vocabulary, the special tokens and the chat template."""
    data = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": sorted(str(t) for t in tokenizer.all_special_tokens),
        "chat_template": getattr(tokenizer, "chat_template", None),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class BaseIdentity(BaseModel):
    """The base model a policy was trained on."""

    model_config = ConfigDict(extra="forbid")

    path: str  # model.path as the run's config gave it
    resolved: str | None  # the directory (or cached model id) it loaded from; None for tiny-random
    fingerprint: str
    shape: dict[str, Any]
    tokenizer: str


def base_identity(path: str, resolved: str | None, model: Any, tokenizer: Any) -> BaseIdentity:
    """The identity of a freshly loaded base model (before any adapter is merged into it)."""
    config = model.config.to_dict()
    return BaseIdentity(
        path=path,
        resolved=resolved,
        fingerprint=weights_fingerprint(model),
        shape={k: config.get(k) for k in _SHAPE_KEYS},
        tokenizer=tokenizer_fingerprint(tokenizer),
    )


class PolicyManifest(BaseModel):
    """``horizonrl_policy.json``: what a policy directory is and what it was trained on."""

    model_config = ConfigDict(extra="allow")

    format: int
    kind: Literal["lora", "full"]
    base: BaseIdentity | None = None
    #: adapters as trained, relative paths, applied in order (all but the last merged into the base)
    stages: list[str] = []
    description: str = ""
    #: sha256 of every other file, relative path -> hex digest
    files: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------------
# LoRA stages and their concatenation (pure functions on state dicts)


@dataclass
class AdapterStage:
    """One LoRA adapter as trained: PEFT's saved tensors (keys without the adapter name) and config."""

    name: str
    weights: dict[str, torch.Tensor]
    config: dict[str, Any]


def stage_from_peft(model: Any, name: str, adapter: str = "default") -> AdapterStage:
    """The active adapter of a PEFT model as a stage (tensors copied to the CPU)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=adapter, save_embedding_layers=False)
    weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
    return AdapterStage(name, weights, _jsonable(model.peft_config[adapter].to_dict()))


def read_stage(folder: Path, name: str | None = None) -> AdapterStage:
    """A PEFT adapter directory as a stage."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    return AdapterStage(name or folder.name, load_file(folder / ADAPTER_WEIGHTS), config)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return sorted(items) if isinstance(value, (set, frozenset)) else items
    if hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):  # enums
        return value.value
    return value


def _scaling(config: dict[str, Any]) -> float:
    unsupported = [k for k in ("use_dora", "use_rslora") if config.get(k)]
    unsupported += [k for k in ("rank_pattern", "alpha_pattern") if config.get(k)]
    if unsupported:
        raise ModelLoadError(f"cannot combine LoRA adapters that use {', '.join(unsupported)}")
    return float(config["lora_alpha"]) / float(config["r"])


def concat_lora(stages: list[AdapterStage], name: str = "policy") -> AdapterStage:
    """One LoRA adapter whose delta is the sum of the stages' deltas: ranks concatenated, each
    stage's scaling folded into its B block, the result's scaling 1 (alpha = r = the ranks' sum).

    For a weight W: sum_i s_i B_i A_i = [s_1 B_1 | ... | s_n B_n] @ [A_1; ...; A_n]. A module one
    stage does not adapt gets a zero block there."""
    if len(stages) == 1:
        return AdapterStage(name, dict(stages[0].weights), dict(stages[0].config))
    scales = [_scaling(s.config) for s in stages]
    ranks = [int(s.config["r"]) for s in stages]
    modules: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for stage in stages:
        for key, tensor in stage.weights.items():
            if key.endswith(".lora_A.weight"):
                prefix = key[: -len(".lora_A.weight")]
                b = stage.weights[prefix + ".lora_B.weight"]
                modules[prefix] = (tensor.shape[1], b.shape[0])  # (in features, out features)
            elif not key.endswith(".lora_B.weight"):
                raise ModelLoadError(f"cannot combine adapter {stage.name!r}: it holds {key!r}, not LoRA A/B")
    weights: dict[str, torch.Tensor] = {}
    for prefix, (fan_in, fan_out) in sorted(modules.items()):
        a_blocks, b_blocks = [], []
        for stage, scale, r in zip(stages, scales, ranks, strict=True):
            a = stage.weights.get(prefix + ".lora_A.weight")
            b = stage.weights.get(prefix + ".lora_B.weight")
            a_blocks.append(a.float() if a is not None else torch.zeros(r, fan_in))
            b_blocks.append(b.float() * scale if b is not None else torch.zeros(fan_out, r))
        weights[prefix + ".lora_A.weight"] = torch.cat(a_blocks, dim=0).contiguous()
        weights[prefix + ".lora_B.weight"] = torch.cat(b_blocks, dim=1).contiguous()
    total = sum(ranks)
    targets: set[str] = set()
    for stage in stages:
        t = stage.config.get("target_modules")
        targets.update([t] if isinstance(t, str) else (t or []))
    config = {**stages[0].config, "r": total, "lora_alpha": total, "target_modules": sorted(targets)}
    config["lora_dropout"] = 0.0
    return AdapterStage(name, weights, config)


def write_adapter(folder: Path, stage: AdapterStage, base_name: str | None) -> None:
    """Write ``stage`` as a PEFT adapter directory recording ``base_name`` as its base."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {**stage.config, "base_model_name_or_path": base_name, "inference_mode": True}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(_jsonable(config), indent=2, sort_keys=True) + "\n")
    save_file(
        {k: v.contiguous() for k, v in stage.weights.items()}, folder / ADAPTER_WEIGHTS, {"format": "pt"}
    )


# ---------------------------------------------------------------------------------------------------
# writing


def write_policy(
    out: Path,
    *,
    model: Any,
    tokenizer: Any | None,
    base: BaseIdentity | None,
    earlier: Sequence[AdapterStage] = (),
    name: str = "rl",
    description: str = "",
) -> None:
    """Write the policy of ``model`` into ``out`` (created; must not exist).

    ``model`` is the trained model: a PEFT model (its active adapter is the last stage, applied on
    top of ``earlier`` stages merged into the base) or a plain model (full weights). The tokenizer
    is saved beside it so the directory loads by itself."""
    out = Path(out)
    out.mkdir(parents=True)
    base_name = (base.resolved or base.path) if base is not None else None
    if hasattr(model, "peft_config"):
        stages = [*earlier, stage_from_peft(model, name)]
        stage_dirs: list[str] = []
        if len(stages) > 1:
            for i, stage in enumerate(stages):
                rel = f"{STAGES_DIR}/{i:02d}_{stage.name}"
                # a stage's real base is the base with the stages before it merged: no model id names it
                real = base_name if i == 0 else f"{STACK_PREFIX}{base_name}+{'+'.join(stage_dirs)})"
                write_adapter(out / rel, stage, real)
                stage_dirs.append(rel)
        write_adapter(out, concat_lora(stages), base_name)
        manifest = PolicyManifest(
            format=FORMAT, kind="lora", base=base, stages=stage_dirs, description=description
        )
    else:
        if earlier:
            raise ValueError("a full model has no adapter stages")
        with quiet_transformers():
            model.save_pretrained(out)
        manifest = PolicyManifest(format=FORMAT, kind="full", base=base, description=description)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    manifest.files = file_digests(out)
    (out / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")


def write_policy_atomic(out: Path, **kwargs: Any) -> None:
    """:func:`write_policy` into a hidden sibling of ``out`` that then replaces ``out`` (an old policy
    there is kept until the new one is whole): a crash leaves the old policy or the new one, and what
    a killed writer left beside it is removed by the next write (:func:`horizonrl.io.replace_dir_atomic`)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_dir_atomic(out, lambda tmp: write_policy(tmp, **kwargs))


def read_manifest(folder: Path, verify: bool = True) -> PolicyManifest:
    """The manifest of a policy directory, with every file it lists checked against its sha256
    (``verify=False``: a caller that verified the files already, as a checkpoint does)."""
    path = Path(folder) / MANIFEST
    try:
        manifest = PolicyManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except Exception as exc:
        raise ModelLoadError(
            f"policy {str(folder)!r}: {MANIFEST} is unreadable ({type(exc).__name__})"
        ) from None
    if manifest.format != FORMAT:
        raise ModelLoadError(
            f"policy {str(folder)!r} has format {manifest.format}; this version reads format {FORMAT}"
        )
    problem = first_problem(Path(folder), manifest.files) if verify else None
    if problem is not None:
        raise ModelLoadError(f"policy {str(folder)!r} is not intact: {problem}")
    return manifest


def trained_adapter_dir(folder: Path) -> Path:
    """The directory of the adapter a run trains (the last stage), inside a LoRA policy of a
    verified checkpoint (its files are not hashed again)."""
    manifest = read_manifest(folder, verify=False)
    return Path(folder) / manifest.stages[-1] if manifest.stages else Path(folder)


# ---------------------------------------------------------------------------------------------------
# checking that an adapter fits


def saved_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in an adapter directory, without loading them."""
    from safetensors import safe_open

    file = Path(folder) / ADAPTER_WEIGHTS
    if not file.is_file():
        raise ModelLoadError(f"adapter {str(folder)!r} has no {ADAPTER_WEIGHTS}")
    try:
        with safe_open(file, framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as exc:
        raise ModelLoadError(f"adapter {str(folder)!r}: {ADAPTER_WEIGHTS} is unreadable ({exc})") from None


def _few(names: Any, n: int = 3) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (and {len(names) - n} more)" if len(names) > n else "")


def check_adapter_fits(model: Any, folder: Path, adapter: str = "default") -> None:
    """Raise unless the adapter saved in ``folder`` filled exactly the LoRA tensors ``model`` has
    for it: every expected tensor present, none unexpected, every shape equal."""
    from peft import get_peft_model_state_dict

    saved = saved_shapes(folder)
    expected = {
        k: tuple(v.shape)
        for k, v in get_peft_model_state_dict(
            model, adapter_name=adapter, save_embedding_layers=False
        ).items()
    }
    problems = []
    if missing := set(expected) - set(saved):
        problems.append(f"{len(missing)} of the model's adapter tensors missing ({_few(missing)})")
    if unexpected := set(saved) - set(expected):
        problems.append(f"{len(unexpected)} tensors that fit no layer ({_few(unexpected)})")
    if shapes := [k for k in set(saved) & set(expected) if saved[k] != expected[k]]:
        k = sorted(shapes)[0]
        problems.append(f"{len(shapes)} shape mismatches (e.g. {k}: saved {saved[k]}, model {expected[k]})")
    if problems:
        raise ModelLoadError(f"adapter {str(folder)!r} does not fit this base model: {'; '.join(problems)}")


def apply_adapter(base: Any, folder: Path, trainable: bool = False) -> Any:
    """``base`` with the adapter in ``folder`` applied (a PeftModel), checked to fit exactly."""
    from peft import PeftModel

    saved_shapes(folder)  # a missing or unreadable weights file is named before peft reads it
    try:
        with warnings.catch_warnings():  # peft warns (and goes on) on keys that fit no layer: we check
            warnings.simplefilter("ignore")
            model = PeftModel.from_pretrained(base, folder, is_trainable=trainable)
    except Exception as exc:
        raise ModelLoadError(f"adapter {str(folder)!r} does not load onto this base: {brief(exc)}") from None
    check_adapter_fits(model, folder)
    return model


def check_base(manifest: PolicyManifest, folder: Path, identity: BaseIdentity) -> None:
    """Raise unless the loaded base (``identity``) is the one the policy was trained on."""
    recorded = manifest.base
    if recorded is None:
        return
    if recorded.fingerprint != identity.fingerprint:
        diff = {k: (recorded.shape.get(k), identity.shape.get(k)) for k in _SHAPE_KEYS}
        diff = {k: v for k, v in diff.items() if v[0] != v[1]}
        detail = (
            ", ".join(f"{k} {a} vs {b}" for k, (a, b) in diff.items())
            if diff
            else "same shape, other weights"
        )
        raise ModelLoadError(
            f"policy {str(folder)!r} was trained on base {recorded.path!r} but model.path={identity.path!r} "
            f"loads a different model ({detail}; weights fingerprint {recorded.fingerprint[:12]} vs "
            f"{identity.fingerprint[:12]}): set model.path to the policy's base"
        )
    if recorded.tokenizer != identity.tokenizer:
        raise ModelLoadError(
            f"policy {str(folder)!r} was trained with another tokenizer than the one of "
            f"model.path={identity.path!r} (tokenizer fingerprint {recorded.tokenizer[:12]} vs "
            f"{identity.tokenizer[:12]})"
        )
