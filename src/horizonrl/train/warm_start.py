"""The starting point of a training run's RL: the SFT warm start (``sft.enabled``), its adapter
restored on a resume, or adopted from another run (``--start-from``).

With LoRA the SFT adapter is saved to ``run_dir/sft_adapter`` (a policy directory of its own) and
merged into the base weights, so RL trains a fresh adapter on top of the SFT model; with full
fine-tuning SFT trains the base weights themselves.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.errors import CheckpointError
from horizonrl.io import replace_dir_atomic
from horizonrl.memory import release_free_memory
from horizonrl.policy import AdapterStage, apply_adapter, read_stage, stage_from_peft, write_policy
from horizonrl.seeds import derive_seed
from horizonrl.train.reporter import Reporter
from horizonrl.train.sft import sft_stage, sft_steps
from horizonrl.types import Trajectory

#: the SFT adapter's policy directory inside a run directory
SFT_ADAPTER = "sft_adapter"


@dataclass
class WarmStart:
    """The weights RL starts from after SFT, and the adapters merged into them."""

    base: Any
    #: adapters trained before the RL adapter and merged into ``base`` (the SFT adapter, with LoRA)
    stages: list[AdapterStage]
    history: list[dict[str, float]]


def sft_warm_start(
    config: Any,
    base: Any,
    demos: Sequence[Trajectory],
    pad_id: int,
    tokenizer: Any,
    base_identity: Any,
    run_dir: Path,
    reporter: Reporter,
) -> WarmStart:
    """The SFT stage of a training run on ``demos`` (adapters initialised from
    ``derive_seed(seed, "sft_init")``, batches ordered by ``seed``), then with LoRA the adapter
    saved to ``run_dir/sft_adapter`` and merged into ``base``."""
    sft = config.sft
    reporter.stage("sft", sft_steps(len(demos), sft))
    model, history = sft_stage(
        base,
        config.model,
        demos,
        sft,
        pad_id,
        seed=config.seed,
        init_seed=derive_seed(config.seed, "sft_init"),
        autocast_dtype=config.train.autocast_dtype,
        on_step=lambda step, total, stats: reporter.advance(loss=stats["loss"]),
    )
    release_free_memory()
    stages: list[AdapterStage] = []
    if config.model.finetune == "lora":
        replace_dir_atomic(
            run_dir / SFT_ADAPTER,
            lambda out: write_policy(
                out,
                model=model,
                tokenizer=tokenizer,
                base=base_identity,
                name="sft",
                description="the SFT warm start (the policy RL starts from)",
            ),
        )
        stages = [stage_from_peft(model, "sft")]
        base = model.merge_and_unload()
    return WarmStart(base, stages, history)


def restore_sft(run_dir: Path, base: Any) -> tuple[Any, list[AdapterStage]]:
    """``base`` with the run's saved SFT adapter merged in, and that adapter's stage (a resumed run,
    or one started from another's start, that used SFT with LoRA)."""
    adapter = run_dir / SFT_ADAPTER
    if not (adapter / "adapter_config.json").is_file():
        raise CheckpointError(f"--resume: the run used SFT but {str(adapter)!r} is missing")
    return apply_adapter(base, adapter).merge_and_unload(), [read_stage(adapter, "sft")]


def copy_sft_adapter(source: Path, run_dir: Path) -> None:
    """The SFT adapter of the run in ``source`` copied into ``run_dir`` (``--start-from``)."""
    shutil.copytree(source / SFT_ADAPTER, run_dir / SFT_ADAPTER, dirs_exist_ok=True)
