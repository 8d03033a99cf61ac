"""``summary.json`` of a training run: where it started and ended, its evals, its time, tokens and
memory, the precision "auto" resolved to, and what a run mode adds (a stream's block). It is rewritten
after every eval, so a stopped run has one too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from horizonrl.hardware import (
    bfloat16_trains_faster,
    native_bfloat16,
    resolve_device,
    resolve_dtype,
    resolve_sampler_dtype,
)
from horizonrl.io import write_text_atomic
from horizonrl.memory import peak_rss_gib
from horizonrl.train.checkpoint import POLICY_DIR
from horizonrl.train.run_state import RunState


def write_summary(
    run_dir: Path,
    config: Any,
    state: RunState,
    *,
    final: bool,
    eval_tasks: int,
    wall: float,
    stage_peaks: Mapping[str, float],
    stage_seconds: Mapping[str, float],
    extras: Mapping[str, Any],
) -> dict[str, Any]:
    """Write ``run_dir/summary.json`` (atomically) and return it. ``final``: the run finished (its
    policy is published); ``wall``: the run's seconds so far, every session; ``stage_peaks`` and
    ``stage_seconds``: the peak memory and seconds of each stage before RL in this session;
    ``extras``: the run mode's keys."""
    st = state
    evals = {int(k): v for k, v in st.evals.items()}
    last = max(evals) if evals else None
    summary = {
        "name": config.name,
        "env": config.env.name,
        "model": config.model.path,
        "steps": st.step,
        "finished": final,
        "base_success": st.base_success,
        "sft": st.sft,
        "start_success": st.start_success,
        "final_success": evals[last] if last is not None else None,
        "gain_over_start": (evals[last] - st.start_success)
        if last is not None and st.start_success is not None
        else None,
        "eval_tasks": eval_tasks,
        "evals": {str(k): evals[k] for k in sorted(evals)},
        # each eval's 95% interval [low, high] (Wilson over tasks; a bootstrap with several samples)
        "eval_intervals": {k: st.eval_intervals[k] for k in sorted(st.eval_intervals, key=int)},
        "wall_s": round(wall, 1),
        "generated_tokens": st.generated_tokens,
        "generated_tokens_per_s": round(st.generated_tokens / wall, 1) if wall else 0.0,
        "role_usage": st.role_usage,
        "peak_rss_gib": round(peak_rss_gib(), 3),
        "peak_rss_gib_by_stage": {k: round(v, 3) for k, v in stage_peaks.items()},
        "wall_s_by_stage": {
            k: round(v, 1)
            for k, v in {**stage_seconds, **{f"rl_{k}": v for k, v in st.rl_seconds.items()}}.items()
        },
        "policy": str(run_dir / POLICY_DIR) if final else None,
        "device": resolve_device(config.model.device),
        "precision": {  # what "auto" resolved to on this machine
            "model": resolve_dtype(config.model.dtype, config.model.device),
            "autocast": str(config.train.autocast_dtype).replace("torch.", "")
            if config.train.autocast_dtype is not None
            else "none",
            "native_bfloat16": native_bfloat16(config.model.device),
            "bfloat16_trains_faster": bfloat16_trains_faster(config.model.device),
            "sampler": resolve_sampler_dtype(config.engine.dtype, config.model.device),
        },
        **extras,
    }
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
