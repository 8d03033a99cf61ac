"""Several LoRA adapters served by one in-process engine, batched together (``HFEngine.add_adapter``).

Design: per-row adapter selection. The adapters stay unmerged on one copy of the base model (a PEFT
model), and every forward of the decode loop names each row's adapter (``adapter_names=[...]``,
``"__base__"`` for the base model: PEFT's mixed-adapter batches). Each adapted linear layer then
computes the base matmul for all rows at once and adds each adapter's low-rank delta to its own rows
only. Requests of different adapters therefore share prefills and decode steps, one continuous
batch as for a single model; what an adapter costs is its rank-r products over its rows. The
alternatives batch worse or cost memory: merging an adapter into the weights serves that adapter
alone (its requests wait for a batch of their own, or the weights are swapped between batches), and
a merged copy of the model per adapter multiplies the weights held.

KV caches depend on the adapter that computed them (every layer's keys and values do), so each cache
the decoder keeps between batches (the shared prompt prefix, finished conversations) records its
adapter and is reused only for rows of the same adapter (:mod:`horizonrl.engine.batch`).

This module checks an adapter directory against the engine's model before anything is loaded and
loads it with PEFT; :class:`~horizonrl.engine.hf.AdapterView` is one adapter of an engine behind the
Engine contract.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

#: The adapter name PEFT's mixed batches give rows decoded with the base model; reserved.
BASE_ADAPTER = "__base__"
#: Where ``PeftModel.save_pretrained`` writes an adapter's config and weights.
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: Prefix of the weight names in an adapter file (the PEFT model wraps the plain one).
_SAVED_PREFIX = "base_model.model."


def adapter_names(adapters: Sequence[str | None]) -> list[str]:
    """Per-row names for PEFT's ``adapter_names`` argument (None, the base model, is ``"__base__"``)."""
    return [BASE_ADAPTER if name is None else name for name in adapters]


def check_adapter_name(name: str) -> None:
    """ValueError unless ``name`` can name an adapter: not empty, not ``"__base__"``, without a dot
    (PEFT keys modules by it) and not part of ``"lora_"`` (PEFT would misread its saved weights)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"add_adapter: an adapter name must be a non-empty string, got {name!r}")
    if name == BASE_ADAPTER:
        raise ValueError(f"add_adapter: {BASE_ADAPTER!r} is reserved for the base model; choose another name")
    if "." in name or name in "lora_":
        raise ValueError(
            f"add_adapter: PEFT cannot hold an adapter named {name!r} (no dots, and not part of 'lora_')"
        )


def check_adapter_folder(folder: Path, model: Any) -> Any:
    """The LoRA config of the adapter saved in ``folder``, after checking that its weights fit
    ``model`` (the engine's model, plain or already carrying adapters): every weight is a LoRA A or B
    matrix of a linear layer the config targets, with that layer's input and output sizes. Nothing
    is loaded into the model; ValueError (one line naming the folder) at the first misfit."""
    from peft import LoraConfig, PeftConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from safetensors import safe_open

    def misfit(what: str) -> ValueError:
        return ValueError(f"add_adapter: {folder}: {what}")

    if not (folder / CONFIG_FILE).is_file():
        raise misfit(f"no {CONFIG_FILE} (not a PEFT adapter directory)")
    if not (folder / WEIGHTS_FILE).is_file():
        raise misfit(f"no {WEIGHTS_FILE} (adapters are read from safetensors only)")
    try:
        config = PeftConfig.from_pretrained(str(folder))
    except Exception as exc:
        raise misfit(f"unreadable {CONFIG_FILE}: {_brief(exc)}") from exc
    if not isinstance(config, LoraConfig):
        raise misfit(f"a {config.peft_type} adapter; only LoRA adapters are served")
    if config.use_dora or config.modules_to_save or getattr(config, "target_parameters", None):
        raise misfit("DoRA, modules_to_save and target_parameters cannot be served per row")
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as weights:
            shapes = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
    except Exception as exc:
        raise misfit(f"unreadable {WEIGHTS_FILE}: {_brief(exc)}") from exc
    if not shapes:
        raise misfit(f"{WEIGHTS_FILE} holds no weights")
    ranks: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        path, _, kind = key.removeprefix(_SAVED_PREFIX).rpartition(".lora_")
        if kind not in ("A.weight", "B.weight") or not key.startswith(_SAVED_PREFIX) or len(shape) != 2:
            raise misfit(f"unexpected weight {key} {list(shape)} (only LoRA A/B matrices of linear layers)")
        ranks.setdefault(path, {})[kind[0]] = shape
    for path, pair in ranks.items():
        try:
            layer = model.get_submodule(path)
        except AttributeError:
            raise misfit(f"the model has no module {path}") from None
        layer = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer
        if not isinstance(layer, torch.nn.Linear):
            raise misfit(f"{path} is a {type(layer).__name__}, not a linear layer")
        if not check_target_module_exists(config, path):
            raise misfit(f"{path} has weights but is not among target_modules {config.target_modules}")
        a, b = pair.get("A"), pair.get("B")
        if a is None or b is None:
            raise misfit(f"{path} has lora_{'A' if a is None else 'B'} missing")
        if a[1] != layer.in_features or b[0] != layer.out_features or a[0] != b[1]:
            raise misfit(
                f"{path}: lora_A {list(a)} and lora_B {list(b)} do not fit a linear layer "
                f"{layer.in_features} -> {layer.out_features}"
            )
    return config


def load_adapter(model: Any, peft_model: Any | None, name: str, folder: Path) -> Any:
    """Load the adapter in ``folder`` (checked with :func:`check_adapter_folder`) as ``name``, unmerged,
    in the dtype of the layers it adapts; returns the PEFT model holding it.

    The first adapter wraps ``model`` (``peft_model`` None) in a PeftModel, which injects LoRA layers
    into ``model`` itself; later ones are loaded into ``peft_model``, and a name already loaded is
    replaced. Should PEFT fail anyway, the adapter is removed again (the first: the LoRA layers too)
    and ValueError raised; the caller unwraps a PEFT model left without adapters (:func:`strip_lora`)."""
    from peft import PeftModel

    device = str(next(model.parameters()).device)
    try:
        with warnings.catch_warnings():  # peft calls transformers APIs deprecated in 5.x
            warnings.simplefilter("ignore", FutureWarning)
            if peft_model is None:
                peft_model = PeftModel.from_pretrained(
                    model, str(folder), adapter_name=name, autocast_adapter_dtype=False, torch_device=device
                )
            else:
                if name in peft_model.peft_config:
                    with warnings.catch_warnings():  # "adapter X was active, now Y is": all are named per row
                        warnings.simplefilter("ignore", UserWarning)
                        peft_model.delete_adapter(name)
                peft_model.load_adapter(
                    str(folder), adapter_name=name, autocast_adapter_dtype=False, torch_device=device
                )
                peft_model.set_adapter(name, inference_mode=True)  # a deleted last adapter left none active
    except Exception as exc:
        if peft_model is None:
            strip_lora(model)
        elif name in peft_model.peft_config:
            peft_model.delete_adapter(name)
        raise ValueError(f"add_adapter: {folder}: PEFT could not load it: {_brief(exc)}") from exc
    _cast_to_layers(peft_model, name)
    peft_model.eval()
    return peft_model


def unload_adapter(model: Any, peft_model: Any, name: str) -> Any | None:
    """Delete adapter ``name`` from ``peft_model``, its LoRA matrices with it; returns the PEFT model
    still holding the others, or None once the last is gone (``model`` is plain again, as before
    the first adapter: :func:`strip_lora`)."""
    if list(peft_model.peft_config) == [name]:
        strip_lora(model)
        return None
    with warnings.catch_warnings():  # "adapter X was active, now Y is": all are named per row
        warnings.simplefilter("ignore", UserWarning)
        peft_model.delete_adapter(name)
    return peft_model


def _cast_to_layers(peft_model: Any, name: str) -> None:
    """Cast adapter ``name``'s weights to the dtype of the layers they adapt (a bfloat16 engine keeps
    bfloat16 LoRA products)."""
    from peft.tuners.lora import LoraLayer

    for module in peft_model.modules():
        if isinstance(module, LoraLayer) and name in module.lora_A:
            dtype = module.get_base_layer().weight.dtype
            module.lora_A[name].to(dtype)
            module.lora_B[name].to(dtype)


def strip_lora(model: Any) -> None:
    """Undo what PEFT did to ``model``: every LoRA layer it injected back to the layer it wrapped,
    and the adapter configs it attached removed (as ``unload`` does)."""
    from peft.tuners.lora import LoraLayer

    for path, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config


def _brief(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
