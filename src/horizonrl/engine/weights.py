"""Copying a trained policy's weights into the engine's model (``HFEngine.update_weights``).

The engine samples from a plain model; the trainer's policy may be the same model, a copy, or a
PEFT LoRA model around it. A LoRA policy is merged on the fly, one weight at a time, so the copy
never holds a merged copy of the whole model. An engine serving LoRA adapters of its own takes the
policy's weights into its base weights and keeps its adapters (:func:`copy_base_weights`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import torch


class Weight(NamedTuple):
    """A weight to copy: its shape, and a function that makes it (a LoRA merge happens there)."""

    shape: torch.Size
    make: Callable[[], torch.Tensor]


def _as_is(value: torch.Tensor) -> Weight:
    return Weight(value.shape, lambda: value)


def plain_weights(policy: Any) -> dict[str, Weight]:
    """``policy``'s weights under plain-model names, each made on demand; a PEFT LoRA model is
    merged on the fly, one weight at a time.

    The policy is not modified: a LoRA-adapted weight is a new tensor (base + delta) made when its
    function is called, so a caller copying weight by weight holds one merged weight at a time, not
    a merged copy of every adapted weight (SmolLM2-135M: 106M float32 weights, ~0.4 GiB)."""
    if not (hasattr(policy, "peft_config") and hasattr(policy, "get_base_model")):
        return {key: _as_is(value) for key, value in policy.state_dict().items()}
    base = policy.get_base_model()
    adapted: dict[str, tuple[Any, list[str]]] = {}
    for name, module in base.named_modules():
        if not hasattr(module, "get_delta_weight") or getattr(module, "merged", False):
            continue
        if getattr(module, "disable_adapters", False):
            continue
        adapters = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
        if adapters:
            adapted[name + ".weight"] = (module, adapters)

    def merged(key: str, value: torch.Tensor) -> torch.Tensor:
        module, adapters = adapted[key]
        delta = sum(module.get_delta_weight(a) for a in adapters)
        return value + delta.to(value.dtype)

    weights: dict[str, Weight] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        if plain in adapted:
            weights[plain] = Weight(value.shape, lambda plain=plain, value=value: merged(plain, value))
        else:
            weights[plain] = _as_is(value)
    return weights


def plain_state_dict(policy: Any, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``policy``'s weights as one plain state dict (a LoRA policy merged weight by weight), in
    ``dtype`` when given: what is sent to engines in other processes."""
    out = {}
    with torch.no_grad():
        for key, weight in plain_weights(policy).items():
            value = weight.make().detach()
            out[key] = (value.to(dtype) if dtype is not None else value).contiguous().cpu()
    return out


def is_same_model(policy: Any, model: Any) -> bool:
    """Whether ``policy`` is ``model`` itself or a PEFT wrapper around it (nothing to copy)."""
    return policy is model or (hasattr(policy, "get_base_model") and policy.get_base_model() is model)


def copy_weights(policy: Any, model: Any) -> None:
    """Copy ``policy``'s weights into ``model`` in place (merging LoRA adapters one weight at a
    time); ValueError naming the first misfits when the two do not have the same weights."""
    own = model.state_dict()
    state = policy.state_dict()
    if state.keys() == own.keys():
        weights = {key: _as_is(value) for key, value in state.items()}
    else:  # e.g. a PEFT policy feeding a plain engine model
        weights = plain_weights(policy)
    _copy_into(model, own, weights)


def copy_base_weights(policy: Any, model: Any) -> None:
    """Copy ``policy``'s weights (a LoRA policy merged, as in :func:`copy_weights`) into the base
    weights of ``model``, a plain model into which PEFT injected the LoRA layers of served adapters;
    the adapters stay as they are. ValueError as :func:`copy_weights`."""
    own = {
        key.replace(".base_layer.", "."): value
        for key, value in model.state_dict().items()
        if ".lora_" not in key
    }
    _copy_into(model, own, plain_weights(policy))


def check_fits(shapes: dict[str, torch.Size], weights: dict[str, Weight], model: str = "model") -> None:
    """ValueError naming the first misfits when ``weights`` do not have exactly the names and
    ``shapes`` of the engine's ``model``."""
    missing = [k for k in shapes if k not in weights]
    unexpected = [k for k in weights if k not in shapes]
    mismatched = [k for k in shapes if k in weights and shapes[k] != weights[k].shape]
    if missing or unexpected or mismatched:
        raise ValueError(
            f"update_weights: the policy's weights do not fit the engine's {model} "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}, shape mismatch {mismatched[:3]})"
        )


def _copy_into(model: Any, own: dict[str, torch.Tensor], weights: dict[str, Weight]) -> None:
    """Copy ``weights`` into the tensors of ``own``, ``model``'s state (same names and shapes), in
    place (:func:`write_weight`)."""
    check_fits({k: v.shape for k, v in own.items()}, weights)
    with torch.no_grad():
        for key, tensor in own.items():
            write_weight(model, key, tensor, weights[key].make())


def sampler_model(model: Any, dtype: str, without: Collection[int] = (), shared: Collection[int] = ()) -> Any:
    """The engine's own copy of a plain (not LoRA-wrapped) model in the sampling dtype
    (``"auto"``: the model's own); parameters whose ``id`` is in ``without`` are left empty (the
    caller fills their place), and those in ``shared`` that already have the sampling dtype are
    the model's own, not copied (weights the trainer never changes: :func:`frozen_weights`).

    Parameters are cast one by one into the copy (tied weights stay tied), so no full-precision
    duplicate of the model is ever materialised (measured: 0.27 GB for SmolLM2-135M in bfloat16,
    instead of a 0.9 GB high-water mark for deepcopy-then-cast)."""
    target = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(dtype, model.dtype)

    def placed(p: torch.nn.Parameter) -> torch.nn.Parameter:
        if id(p) in without:
            return torch.nn.Parameter(p.new_empty(0, dtype=target), requires_grad=False)
        if id(p) in shared and p.dtype == target:
            return p
        return torch.nn.Parameter(p.detach().to(target, copy=True), requires_grad=False)

    memo: dict[int, Any] = {id(p): placed(p) for p in model.parameters()}
    out = copy.deepcopy(model, memo).to(target).eval()
    #: names of the parameters that are ``model``'s own (placed as they are: see :func:`write_weight`)
    own = {id(p) for p in model.parameters()}
    out._horizonrl_shared = {n for n, p in out.named_parameters(remove_duplicate=False) if id(p) in own}
    return out


def frozen_weights(model: Any, finetune: str, lora_targets: Collection[str]) -> set[int]:
    """The ids of ``model``'s parameters a trainer of it never changes, which an engine's copy in the
    same process may share rather than copy: under LoRA (``finetune == "lora"``), the input embedding
    (and an output head tied to it) unless a LoRA target names it; nothing under full fine-tuning.
    SmolLM2-135M's embedding is 113 MB in float32."""
    embedding = getattr(model, "get_input_embeddings", lambda: None)()
    if finetune != "lora" or embedding is None:
        return set()
    params = {id(p) for p in embedding.parameters()}
    ends = [m for m in (embedding, model.get_output_embeddings()) if m is not None]
    names = [n for n, m in model.named_modules() if any(m is e for e in ends)]
    # PEFT matches a target against a module name's end
    if any(n == t or n.endswith(f".{t}") for n in names for t in lora_targets):
        return set()
    return params


def write_weight(model: Any, key: str, tensor: torch.Tensor, value: torch.Tensor) -> None:
    """Copy ``value`` into ``model``'s weight ``key`` (its tensor ``tensor``) in place; nothing to do
    when the weight is ``value`` itself (shared with the trainer: :func:`sampler_model`). A shared
    weight given other values is never written into (it is the trainer's): the engine takes its own
    copy of them instead."""
    if tensor.data_ptr() == value.data_ptr() and tensor.shape == value.shape:
        return
    shared: set[str] = getattr(model, "_horizonrl_shared", set())
    if key not in shared:
        tensor.copy_(value)
        return
    owner, _, name = key.rpartition(".")
    own = torch.nn.Parameter(value.detach().to(tensor.dtype, copy=True), requires_grad=False)
    setattr(model.get_submodule(owner), name, own)
    shared.discard(key)
