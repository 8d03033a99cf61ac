"""The one policy builder: a base model in, what a trainer trains out.

:func:`build_policy` is how every trainer gets its policy: `horizon train` (its SFT stage, the RL
policy in the driver and the same policy in every data-parallel trainer rank), `horizon sft`,
`horizon dpo`, MALT's role-wise and online training, and :func:`horizonrl.models.load_model` with
``trainable``. So ``model.finetune``, ``model.lora`` and ``model.gradient_checkpointing`` mean the same
under every command. It takes the sections it needs (the ``model:`` section, the optimizer settings)
as arguments and loads nothing: the caller hands it a loaded base model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from horizonrl.errors import ModelLoadError, brief
from horizonrl.model_config import LoraSettings, ModelConfig


class OptimizerSpec(Protocol):
    """The optimizer settings the builder reads (``train``, ``sft`` and ``dpo`` sections all have them)."""

    lr: float
    weight_decay: float
    warmup_steps: int


@dataclass
class TrainablePolicy:
    """A policy ready to train: ``model`` (LoRA-wrapped or the base with every weight trainable, in
    train mode), the extra modules trained beside it (``"value_head"``: PPO's critic) and, when the
    caller asked for them, the AdamW optimizer over both and its warm-up schedule."""

    model: Any
    modules: dict[str, Any] = field(default_factory=dict)
    optimizer: Any = None
    scheduler: Any = None


def wrap_lora(model: Any, settings: LoraSettings) -> Any:
    """Add fresh LoRA adapters; only their parameters stay trainable."""
    from peft import LoraConfig, get_peft_model

    lora_cfg = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x
            warnings.simplefilter("ignore", FutureWarning)
            return get_peft_model(model, lora_cfg)
    except ValueError as exc:
        raise ModelLoadError(
            f"Cannot add LoRA adapters (target_modules={settings.target_modules}): {brief(exc)}"
        ) from exc


def enable_checkpointing(model: Any) -> None:
    """Gradient checkpointing of every decoder layer (the non-reentrant kind: LoRA's frozen inputs need
    no ``requires_grad`` trick). It acts only in training mode with gradients on, so a sampling copy
    of the same weights decodes with its KV cache as before."""
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x's name
    try:
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    except ValueError as exc:  # transformers: "... does not support gradient checkpointing"
        raise ModelLoadError(
            f"model.gradient_checkpointing: true, but this model cannot checkpoint: {brief(exc)}; "
            "set it to false"
        ) from exc


def build_policy(
    base: Any,
    model: ModelConfig,
    *,
    optim: OptimizerSpec | None = None,
    critic: Literal["none", "value_head"] = "none",
    init_seed: int | None = None,
    has_adapter: bool = False,
) -> TrainablePolicy:
    """``base`` made trainable as ``model`` says, in train mode.

    - ``model.gradient_checkpointing``: every decoder layer recomputed in the backward pass;
    - ``model.finetune``: ``lora`` wraps ``base`` in fresh adapters (``model.lora``; not when
      ``has_adapter``: ``base`` carries a trainable adapter already), ``full`` trains every weight;
    - ``critic="value_head"``: a linear value head on the last hidden state (``modules["value_head"]``);
    - ``optim``: AdamW over the trainable parameters and the value head, with its warm-up schedule
      (None: the caller's trainer makes its own, or the caller does not step one);
    - ``init_seed``: seeds torch before the adapters and the value head are initialised, so they
      depend on that seed alone, not on what consumed random numbers before (an SFT stage).

    ``base`` is changed in place (PEFT injects the adapters into its modules)."""
    import torch

    if critic not in ("none", "value_head"):
        raise ValueError(f"critic must be 'none' or 'value_head', got {critic!r}")
    if init_seed is not None:
        torch.manual_seed(init_seed % 2**63)
    if model.gradient_checkpointing:
        enable_checkpointing(base)
    if model.finetune == "lora" and not has_adapter:
        policy = wrap_lora(base, model.lora)
    elif model.finetune == "full":
        policy = base.requires_grad_(True)
    else:
        policy = base
    modules: dict[str, Any] = {}
    if critic == "value_head":
        from horizonrl.algos.critic import make_value_head

        modules["value_head"] = make_value_head(policy)
    built = TrainablePolicy(policy.train(), modules)
    if optim is not None:
        from horizonrl.optim import make_optimizer

        built.optimizer, built.scheduler = make_optimizer(
            policy, optim.lr, optim.weight_decay, optim.warmup_steps, list(modules.values())
        )
    return built
