"""`horizon train`: base eval → optional SFT warm start → eval → GRPO steps with periodic evals.

The run directory (docs/training.md) is written as the run goes: the resolved config first, then per
step one trajectory file, one ``metrics.jsonl`` line (fsynced) and TensorBoard scalars, and a
checkpoint every ``train.save_every`` steps — including step 0, right after the warm start and the
starting eval, so an interrupted run never repeats them. ``summary.json`` and ``curves.png`` are
rewritten after every eval, so a stopped run still has both. Ctrl-C saves the last finished step.

Two copies of the weights exist: the float32 policy the optimizer updates (LoRA adapters by default)
and the sampling model inside the engine (``engine.dtype``, bfloat16 by default), refreshed from the
policy after every optimizer step with ``engine.update_weights``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from horizonrl.agent.loop import Agent
from horizonrl.algos.critic import make_value_head
from horizonrl.analysis.signals import penalize
from horizonrl.build import apply_memory_settings, env_factory, eval_tasks, make_tasks
from horizonrl.config import RunConfig
from horizonrl.engine.replay import ConstraintReplay
from horizonrl.errors import CheckpointError, ConfigError
from horizonrl.hardware import native_bfloat16, resolve_device, resolve_dtype
from horizonrl.io import replace_dir_atomic, write_text_atomic
from horizonrl.memory import peak_rss_gib, release_free_memory
from horizonrl.models import load_base, wrap_lora
from horizonrl.policy import AdapterStage, apply_adapter, read_stage, stage_from_peft, write_policy
from horizonrl.rollout.base import RolloutResult
from horizonrl.rollout.failures import apply_failure_policy
from horizonrl.rollout.runner import run_rollouts
from horizonrl.rollout.stats import summarize
from horizonrl.runtime import make_backend
from horizonrl.seeds import derive_seed
from horizonrl.serve.external import episode_agent, served
from horizonrl.train.attribution import AttributionStage
from horizonrl.train.checkpoint import (
    POLICY_DIR,
    latest_checkpoint,
    load_training_state,
    policy_dir,
    save_checkpoint,
)
from horizonrl.train.experience import ExperienceStage
from horizonrl.train.interrupt import stop_on_signals
from horizonrl.train.optim import make_optimizer
from horizonrl.train.rundir import Start, borrowed_start, check_fresh, claim_run_dir, resume_start
from horizonrl.train.sft import gather_demos, train_sft
from horizonrl.train.staleness import filter_stale
from horizonrl.train.tracking import Tracker, plot_curves
from horizonrl.train.update import train_step
from horizonrl.types import Task, Trajectory

SFT_ADAPTER = "sft_adapter"


class Reporter:
    """Progress callbacks of a training run (the CLI draws them with rich; the default is silent)."""

    def stage(self, name: str, total: int | None = None) -> None: ...

    def advance(self, **fields: Any) -> None: ...

    def message(self, text: str) -> None: ...

    def status(self, text: str) -> None:
        """A live one-line status (episodes in flight per rollout stage)."""


@dataclass
class RunState:
    """What a checkpoint must remember beyond the weights and the optimizer."""

    step: int = 0
    base_success: float | None = None
    start_success: float | None = None
    sft: bool = False
    evals: dict[str, float] = field(default_factory=dict)  # step (as str) -> held-out success
    wall_s: float = 0.0
    generated_tokens: int = 0
    scheduler: dict[str, Any] = field(default_factory=dict)  # the LR schedule's state_dict
    task_cursor: int = 0  # training tasks consumed so far (the data order of an exact resume)
    #: seconds the RL steps spent so far in rollouts, updates (with the engine refresh) and evals
    rl_seconds: dict[str, float] = field(default_factory=dict)
    #: what a run mode beyond plain training must carry across a resume (a stream's weights, its
    #: task source's position, the feedback read so far)
    stream: dict[str, Any] = field(default_factory=dict)
    #: calls and tokens of the LLM roles (extractor, judge, annotator) so far, per role
    role_usage: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def wrap_policy(config: RunConfig, base: Any) -> tuple[Any, dict[str, Any], Any, Any]:
    """The RL policy on ``base`` (fresh LoRA adapters, or the base itself trainable), its extra
    modules (a value head) and its optimizer and schedule; the same in the driver and in every
    trainer rank. The adapter's (and value head's) initialisation depends on the run seed alone,
    not on what consumed random numbers before (an SFT stage, or a run started from another's start)."""
    torch.manual_seed(derive_seed(config.seed, "policy_init") % 2**63)
    if config.model.finetune == "lora":
        policy = wrap_lora(base, config.model.lora)
    else:
        policy = base.requires_grad_(True)
    tc = config.train
    modules: dict[str, Any] = {}
    if tc.critic == "value_head":
        modules["value_head"] = make_value_head(policy)
    optimizer, scheduler = make_optimizer(
        policy, tc.lr, tc.weight_decay, tc.warmup_steps, list(modules.values())
    )
    return policy, modules, optimizer, scheduler


class TrainingRun:
    """One `horizon train` invocation over a run directory."""

    def __init__(
        self,
        config: RunConfig,
        reporter: Reporter | None = None,
        resume: bool = False,
        overwrite: bool = False,
        start_from: Path | None = None,
    ) -> None:
        if resume and overwrite:
            raise ConfigError(
                "--resume continues a run and --overwrite replaces it (moving it to output_dir/.trash): "
                "pass one of them"
            )
        if resume and start_from is not None:
            raise ConfigError("--resume continues a run and --start-from begins a new one: pass one of them")
        #: another run whose starting point (base eval, SFT, start eval) this run reuses
        self.start_from = Path(start_from) if start_from is not None else None
        self.config = config
        self.overwrite = overwrite
        #: peak resident memory (GiB) so far at the end of each stage of this invocation
        self.stage_peaks: dict[str, float] = {}
        #: seconds each stage before RL took in this invocation
        self.stage_seconds: dict[str, float] = {}
        self.reporter = reporter or Reporter()
        self.resume = resume
        self.run_dir = config.run_dir
        self.state = RunState()
        self._session_start = time.perf_counter()
        self._wall_before = 0.0  # wall time of earlier sessions of a resumed run
        self._saved_step = -1
        #: adapters trained before the RL adapter and merged into ``self.base`` (the SFT adapter)
        self.stages: list[AdapterStage] = []
        self._borrowed: Start | None = None  # the --start-from run's step-0 checkpoint, once checked
        self._trainer_group: Any = None  # the data-parallel trainer ranks, when the backend has them
        self._demos: list[Trajectory] | None = None  # sft.demos, gathered once (SFT, train.demo_coef)
        self.stop_signal: str | None = None  # the name of the signal that asked the run to stop

    # ------------------------------------------------------------------ setup
    def _check_dir(self) -> Start | None:
        """Refuse what cannot start before anything is loaded or touched: return the checkpoint to
        resume from (verified), or None for a fresh run (whose ``--start-from`` run is checked)."""
        if self.resume:
            return resume_start(self.run_dir, self.config)
        check_fresh(self.run_dir, self.overwrite)
        if self.start_from is not None:
            self._borrowed = borrowed_start(self.start_from, self.config)
        return None

    def _claim_dir(self) -> None:
        moved = claim_run_dir(self.run_dir, self.config, self.overwrite)
        if moved is not None:
            self.reporter.message(f"--overwrite: moved the old run to {moved}")

    def _build(self) -> None:
        cfg = self.config
        apply_memory_settings(cfg)
        asyncio.run(env_factory(cfg)().close())  # the env builds before a run directory is touched
        loaded = load_base(cfg.model)
        self.base, self.tokenizer, self.base_identity = loaded.base, loaded.tokenizer, loaded.identity
        self.backend = make_backend(cfg)  # local, or workers on a Ray cluster (joined or started here)
        self.engine = self.backend.engine(self.base, self.tokenizer)
        self.agent = Agent(self.tokenizer, self.engine, cfg.sampling, cfg.agent, self.engine.max_context)
        #: who plays the episodes: the agent loop, or a user's program through the policy server
        self.player = episode_agent(cfg, self.engine, self.tokenizer, self.agent, self.run_dir / "external")
        self.env_factory = self.backend.env_factory()
        self.pad_id = self.engine.pad_token_id
        self.eval_tasks = eval_tasks(cfg)
        self.experience: ExperienceStage | None = None
        self.attribution: AttributionStage | None = None
        self.annotator: Any = None
        #: the LLM roles this run asks (name -> client), whose calls and tokens it counts
        self.used_roles: dict[str, Any] = {}
        self._role_usage_counted: dict[str, dict[str, int]] = {}
        if cfg.experience.enabled or cfg.attribution.enabled or cfg.train.failure_judge:
            from horizonrl.roles import Roles

            roles = Roles(cfg.roles, self.engine, self.tokenizer)
            wanted = [
                name
                for name, on in (
                    ("annotator", cfg.train.failure_judge),
                    ("extractor", cfg.experience.enabled),
                    ("judge", cfg.attribution.enabled),
                )
                if on
            ]
            self.used_roles = {name: roles.get(name) for name in wanted}
            self.annotator = self.used_roles.get("annotator")
            if cfg.experience.enabled:
                tools = [t.name for t in self.env_factory().tools] or None  # None: they vary by task
                self.experience = ExperienceStage(
                    cfg.experience, self.used_roles["extractor"], self.tokenizer, tools
                )
            if cfg.attribution.enabled:
                self.attribution = AttributionStage(cfg.attribution, self.used_roles["judge"])

    def _wrap_policy(self) -> None:
        self.policy, self.modules, self.optimizer, self.scheduler = wrap_policy(self.config, self.base)
        #: rebuilds the masks of constrained turns for the update (agent.constrain)
        self.replay = (
            ConstraintReplay(self.tokenizer, self.base) if self.config.agent.constrain != "none" else None
        )

    # ------------------------------------------------------------------ stages
    def _rollouts(
        self,
        tasks: Sequence[Task],
        samples: int,
        sampling: Any,
        out: Path,
        label: str,
        concurrency: int,
        append: bool = False,
        notes: dict[str, str] | None = None,
    ) -> RolloutResult:
        """Roll out ``tasks`` (``samples`` each) with the configured scheduler, streaming records to
        ``out``; the result's metrics include the engine's batching over this rollout."""
        out.parent.mkdir(parents=True, exist_ok=True)
        self.reporter.stage(label, len(tasks) * samples)
        solved = 0
        with out.open("a" if append else "w", encoding="utf-8") as sink:

            def on_trajectory(traj: Trajectory) -> None:
                nonlocal solved
                solved += traj.success
                sink.write(traj.to_json() + "\n")
                sink.flush()
                self.reporter.advance(success=solved)

            before = self.engine.stats
            result = asyncio.run(
                served(
                    self.player,
                    run_rollouts(
                        self.player,
                        self.env_factory,
                        tasks,
                        samples,
                        concurrency,
                        sampling=sampling,
                        on_trajectory=on_trajectory,
                        mode=self.config.rollout.mode,
                        limits=self.config.rollout.limits(concurrency),
                        on_status=lambda status: self.reporter.status(str(status)),
                        notes=notes,
                        eta=self.config.experience.eta,
                    ),
                )
            )
            after = self.engine.stats
        steps = after["decode_steps"] - before["decode_steps"]
        result.metrics["engine/mean_batch_size"] = (
            (after["decode_rows"] - before["decode_rows"]) / steps if steps else 0.0
        )
        result.metrics["engine/batches"] = float(after["batches"] - before["batches"])
        self.state.generated_tokens += int(after["generated_tokens"] - before["generated_tokens"])
        return result

    def evaluate(self, label: str, step: int) -> float:
        ev = self.config.eval
        sampling = self.config.sampling.model_copy(update={"temperature": ev.temperature})
        out = self.run_dir / "eval" / f"{label}.jsonl"
        trajs = self._rollouts(self.eval_tasks, 1, sampling, out, f"eval {label}", ev.concurrency)
        success = summarize(trajs)["success_rate"]
        self.state.evals[str(step)] = success
        self.reporter.message(f"held-out success ({label}, {len(trajs)} tasks): {success:.1%}")
        return success

    def warm_start(self) -> None:
        """SFT on demonstrations, then merge the SFT adapter into the base weights (the RL start)."""
        cfg = self.config
        sft = cfg.sft
        self.reporter.stage("demos", None)
        demos = self._demonstrations()
        self.engine.drop_caches()  # the eval's KV caches are not needed while training
        steps = -(-len(demos) // sft.batch_size) * sft.epochs
        self.reporter.stage("sft", steps)
        torch.manual_seed(derive_seed(cfg.seed, "sft_init") % 2**63)  # a reproducible adapter init
        lora = wrap_lora(self.base, cfg.model.lora) if cfg.model.finetune == "lora" else self.base
        history = train_sft(
            lora,
            demos,
            sft,
            self.pad_id,
            seed=cfg.seed,
            autocast_dtype=cfg.train.autocast_dtype,
            on_step=lambda step, total, stats: self.reporter.advance(loss=stats["loss"]),
        )
        release_free_memory()
        if cfg.model.finetune == "lora":
            replace_dir_atomic(
                self.run_dir / SFT_ADAPTER,
                lambda out: write_policy(
                    out,
                    model=lora,
                    tokenizer=self.tokenizer,
                    base=self.base_identity,
                    name="sft",
                    description="the SFT warm start (the policy RL starts from)",
                ),
            )
            self.stages = [stage_from_peft(lora, "sft")]
            self.base = lora.merge_and_unload()
        self.engine.update_weights(self.base)
        self.state.sft = True
        self.reporter.message(
            f"SFT: {len(demos)} demonstrations, {len(history)} steps, final loss {history[-1]['loss']:.3f}"
        )

    def _demonstrations(self) -> list[Trajectory]:
        """The demonstrations ``sft.demos`` names (the SFT stage's, and the ``train.demo_coef``
        term's), gathered on first use: the oracle's are the same episodes again after a resume."""
        if self._demos is None:
            self._demos = gather_demos(self.config, self.agent, self.env_factory)
        return self._demos

    def _adopt_start(self, source: Path) -> None:
        """Start RL from the step-0 state of the run in ``source`` (its base and start evals and its
        SFT adapter) instead of repeating them: runs that differ only in their RL settings then start
        from the same policy, as a side-by-side comparison needs."""
        assert self._borrowed is not None  # checked by _check_dir before anything was touched
        saved = RunState.from_dict(self._borrowed.state)
        self.state.base_success, self.state.start_success = saved.base_success, saved.start_success
        self.state.evals = {"0": saved.start_success} if saved.start_success is not None else {}
        if saved.sft:  # model.finetune is lora (checked by _start_checkpoint)
            shutil.copytree(source / SFT_ADAPTER, self.run_dir / SFT_ADAPTER, dirs_exist_ok=True)
            self.state.sft = True
            self._restore_sft()
            self.engine.update_weights(self.base)
        self.reporter.message(
            f"starting from {source}: base {saved.base_success:.1%}, start {saved.start_success:.1%}"
        )

    def _restore_sft(self) -> None:
        adapter = self.run_dir / SFT_ADAPTER
        if not self.state.sft or self.config.model.finetune != "lora":
            return
        if not (adapter / "adapter_config.json").is_file():
            raise CheckpointError(f"--resume: the run used SFT but {str(adapter)!r} is missing")
        self.stages = [read_stage(adapter, "sft")]
        self.base = apply_adapter(self.base, adapter).merge_and_unload()

    # ------------------------------------------------------------------ bookkeeping
    def _save_extras(self, checkpoint: Path) -> None:
        """The state of the self-evolution stages that a checkpoint holds beside the weights."""
        for stage in (self.experience, self.attribution):
            if stage is not None:
                stage.save(checkpoint)

    def _save(self, step: int) -> None:
        group = self._trainer_group
        if group is not None:  # the optimizer lives in the ranks; the checkpoint holds rank 0's
            group.pull_optimizer(self.optimizer, self.scheduler)
        self.state.step = step
        self.state.wall_s = self._wall()
        self.state.scheduler = self.scheduler.state_dict()
        save_checkpoint(
            self.run_dir,
            step,
            self.policy,
            self.optimizer,
            self.state.to_dict(),
            self.config.train.keep_checkpoints,
            modules=self.modules,
            write_policy=lambda out: write_policy(
                out,
                model=self.policy,
                tokenizer=self.tokenizer,
                base=self.base_identity,
                earlier=self.stages,
                name="rl",
                description=f"run {self.config.name!r} after RL step {step}",
            ),
            write_extras=self._save_extras,
        )
        self._saved_step = step

    def _wall(self) -> float:
        return self._wall_before + (time.perf_counter() - self._session_start)

    def write_summary(self, final: bool) -> dict[str, Any]:
        st = self.state
        evals = {int(k): v for k, v in st.evals.items()}
        last = max(evals) if evals else None
        wall = self._wall()
        summary = {
            "name": self.config.name,
            "env": self.config.env.name,
            "model": self.config.model.path,
            "steps": st.step,
            "finished": final,
            "base_success": st.base_success,
            "sft": st.sft,
            "start_success": st.start_success,
            "final_success": evals[last] if last is not None else None,
            "gain_over_start": (evals[last] - st.start_success)
            if last is not None and st.start_success is not None
            else None,
            "eval_tasks": len(self.eval_tasks),
            "evals": {str(k): evals[k] for k in sorted(evals)},
            "wall_s": round(wall, 1),
            "generated_tokens": st.generated_tokens,
            "generated_tokens_per_s": round(st.generated_tokens / wall, 1) if wall else 0.0,
            "role_usage": st.role_usage,
            "peak_rss_gib": round(peak_rss_gib(), 3),
            "peak_rss_gib_by_stage": {k: round(v, 3) for k, v in self.stage_peaks.items()},
            "wall_s_by_stage": {
                k: round(v, 1)
                for k, v in {**self.stage_seconds, **{f"rl_{k}": v for k, v in st.rl_seconds.items()}}.items()
            },
            "policy": str(self.run_dir / POLICY_DIR) if final else None,
            "device": resolve_device(self.config.model.device),
            "precision": {  # what "auto" resolved to on this machine
                "model": resolve_dtype(self.config.model.dtype, self.config.model.device),
                "autocast": str(self.config.train.autocast_dtype).replace("torch.", "")
                if self.config.train.autocast_dtype is not None
                else "none",
                "native_bfloat16": native_bfloat16(self.config.model.device),
            },
            **self._summary_extras(),
        }
        write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary

    def _summary_extras(self) -> dict[str, Any]:
        """What a run mode adds to ``summary.json`` (nothing for plain training)."""
        return {}

    # ------------------------------------------------------------------ main loop
    @contextlib.contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        """Record the seconds a stage before RL takes and the peak memory at its end."""
        start = time.perf_counter()
        yield
        self.stage_seconds[name] = time.perf_counter() - start
        self.stage_peaks[name] = peak_rss_gib()

    def _reach_start(self) -> None:
        """Base eval, then (when enabled) the SFT warm start and the eval of the policy RL starts from."""
        with self._stage("base_eval"):
            self.state.base_success = self.evaluate("base", 0)
        if self.config.sft.enabled:
            with self._stage("sft"):
                self.warm_start()
            with self._stage("start_eval"):
                self.state.start_success = self.evaluate("start", 0)
        else:
            self.state.start_success = self.state.base_success

    def _request_stop(self, name: str) -> None:
        self.stop_signal = name

    def _check_stop(self) -> None:
        """Stop at a phase boundary if a signal came while a phase absorbed its interrupt."""
        if self.stop_signal is not None:
            raise KeyboardInterrupt

    def run(self) -> dict[str, Any]:
        """The whole run (see the module doc); the backend's workers are stopped however it ends.
        SIGTERM and Ctrl-C stop it where it is (:mod:`horizonrl.train.interrupt`), after saving the
        last finished step."""
        try:
            with stop_on_signals(self._request_stop):
                return self._run()
        finally:
            backend = getattr(self, "backend", None)
            if backend is not None:
                backend.close()

    def _run(self) -> dict[str, Any]:
        start = self._check_dir()
        self.reporter.stage("loading model", None)
        with self._stage("load"):
            self._build()
        if start is None:
            self._claim_dir()
            if self.start_from is not None:
                self._adopt_start(self.start_from)
            else:
                self._reach_start()
            self._wrap_policy()
            seeded = self.experience.seed_pool() if self.experience is not None else {}
            self._save(0)
        else:
            ckpt = start.checkpoint
            self.state = RunState.from_dict(start.state)
            self._wall_before = self.state.wall_s
            self._restore_sft()
            self._wrap_policy()
            load_training_state(ckpt, self.optimizer, self.policy, self.modules)
            for stage in (self.experience, self.attribution):
                if stage is not None:
                    stage.load(ckpt)
            if self.state.scheduler:
                self.scheduler.load_state_dict(self.state.scheduler)
            self.engine.update_weights(self.policy)
            self._saved_step = self.state.step
            self.reporter.message(f"resumed from {ckpt} (step {self.state.step})")
        with Tracker(self.run_dir, resume_step=self.state.step if start is not None else None) as tracker:
            if start is None:
                tracker.log(
                    0,
                    {
                        "eval/success": self.state.start_success,
                        "eval/base_success": self.state.base_success,
                        **seeded,
                    },
                )
            self.write_summary(final=False)
            try:
                self._loop(tracker)
            except KeyboardInterrupt:
                if self.state.step > self._saved_step:
                    self._save(self.state.step)
                self.write_summary(final=False)
                raise
        self._publish_policy()
        summary = self.write_summary(final=True)
        plot_curves(self.run_dir)
        return summary

    def _publish_policy(self) -> None:
        """Copy the last checkpoint's policy to ``run_dir/policy`` (the run's result)."""
        last = latest_checkpoint(self.run_dir)
        if last is not None:
            replace_dir_atomic(self.run_dir / POLICY_DIR, lambda out: shutil.copytree(policy_dir(last), out))

    def _step_rollouts(
        self, step: int, train_tasks: Sequence[Task]
    ) -> tuple[list[Trajectory], list[Trajectory], dict[str, float], int]:
        """A step's rollouts: ``(sampled, trainable, metrics, task cursor after them)``. Tasks come in
        order from the training stream from ``state.task_cursor`` on (the caller advances it when the
        step is done); each round samples with its own derived seed. With dynamic
        sampling (DAPO), groups whose rewards are all equal are dropped and further tasks are rolled
        out until ``tasks_per_step`` groups have signal or ``max_sampling_rounds`` are used."""
        cfg, tc = self.config, self.config.train
        out = self.run_dir / "trajectories" / f"step_{step:06d}.jsonl"
        rounds = tc.max_sampling_rounds if tc.dynamic_sampling else 1
        sampled: list[Trajectory] = []
        trainable: list[Trajectory] = []
        metrics: dict[str, float] = {}
        informative = 0
        cursor = self.state.task_cursor
        for round_ in range(rounds):
            need = tc.tasks_per_step - informative
            tasks = [train_tasks[(cursor + i) % len(train_tasks)] for i in range(need)]
            cursor += need
            sampling = cfg.sampling.model_copy(
                update={"seed": derive_seed(cfg.seed, "rollout", step, round_)}
            )
            label = f"step {step}/{tc.steps}" + (f" round {round_ + 1}" if round_ else "")
            notes = self.experience.notes(tasks) if self.experience is not None else None
            rollout = self._rollouts(
                tasks, tc.group_size, sampling, out, label, tc.concurrency, append=round_ > 0, notes=notes
            )
            kept, failure_metrics = apply_failure_policy(rollout, cfg.rollout.on_failure)
            if tc.failure_penalties:  # failures as signals: the reward trained on is shaped
                kept, signal_metrics = penalize(kept, tc.failure_penalties, self.annotator)
                failure_metrics.update(signal_metrics)
            sampled.extend(rollout)
            for key, value in {**rollout.metrics, **failure_metrics}.items():
                metrics[key] = metrics.get(key, 0.0) + value if key.startswith("failures/") else value
            if not tc.dynamic_sampling:
                trainable = kept
                break
            rewards: dict[str, set[float]] = {}
            for traj in kept:
                rewards.setdefault(traj.group_id, set()).add(traj.reward)
            useful = [g for g in rewards if len(rewards[g]) > 1][: tc.tasks_per_step - informative]
            trainable.extend(t for t in kept if t.group_id in set(useful))
            informative += len(useful)
            metrics["sampling/rounds"] = float(round_ + 1)
            if informative >= tc.tasks_per_step:
                break
        if tc.dynamic_sampling:
            metrics["sampling/groups_with_signal"] = float(informative)
            metrics["sampling/groups_sampled"] = float(len({t.group_id for t in sampled}))
        return sampled, trainable, metrics, cursor

    def _loop(self, tracker: Tracker) -> None:
        """The RL steps: rollouts, :func:`~horizonrl.train.update.train_step` on them (the new
        weights then go to the engine), then the step's metrics, evals and checkpoints."""
        cfg, tc = self.config, self.config.train
        rounds = tc.max_sampling_rounds if tc.dynamic_sampling else 1
        train_tasks = make_tasks(
            cfg, cfg.rollout.split, max(tc.steps, 1) * tc.tasks_per_step * rounds, cfg.rollout.seed
        )
        group = self.backend.trainer_group()
        if group is not None:  # the ranks start from exactly this policy and optimizer state
            group.load(self.stages, self.policy, self.modules, self.optimizer, self.scheduler)
            self._trainer_group = group
        for step in range(self.state.step + 1, tc.steps + 1):
            t0 = time.perf_counter()
            sampled, trainable, rollout_metrics, cursor = self._step_rollouts(step, train_tasks)
            self._check_stop()  # an interrupted rollout is not trained on
            trainable, version_metrics = filter_stale(
                trainable, self.engine.weights_version, tc.max_staleness, tc.stale_samples
            )
            rollout_metrics.update(version_metrics)
            clip_high: list[float | None] | None = None
            if self.experience is not None:  # learn from the samples, then train on them stripped
                rollout_metrics.update(asyncio.run(self.experience.extract(sampled, step)))
                trainable, clip_high, experience_metrics = self.experience.prepare(trainable)
                rollout_metrics.update(experience_metrics)
            token_advantages: list[list[float]] | None = None
            if self.attribution is not None and trainable:  # the judge labels before the weights move
                record = self.run_dir / "attribution" / f"step_{step:06d}.jsonl"
                token_advantages, attribution_metrics = asyncio.run(
                    self.attribution.advantages(trainable, record)
                )
                rollout_metrics.update(attribution_metrics)
            t1 = time.perf_counter()
            self.reporter.stage(f"update {step}/{tc.steps}", None)
            update = self._update_policy(step, trainable, sampled, clip_high, token_advantages)
            t2 = time.perf_counter()
            self.state.step, self.state.task_cursor = step, cursor
            metrics: dict[str, Any] = {**summarize(sampled), **rollout_metrics, **update}
            metrics.update({"rollout_s": t1 - t0, "update_s": t2 - t1, "peak_rss_gib": peak_rss_gib()})
            self._finish_step(step, metrics, tracker)

    def _update_policy(
        self,
        step: int,
        trainable: Sequence[Trajectory],
        sampled: Sequence[Trajectory],
        clip_high: list[float | None] | None = None,
        token_advantages: list[list[float]] | None = None,
    ) -> dict[str, float]:
        """One :func:`~horizonrl.train.update.train_step` on ``trainable`` (in the data-parallel ranks
        when the backend has them), then the new weights to the engine; the update's metrics, or
        why there was none."""
        if not trainable:
            return self._no_update(step, sampled)
        cfg, group = self.config, self._trainer_group
        self.engine.drop_caches()
        temperature, seed = cfg.sampling.temperature or 1.0, derive_seed(cfg.seed, "update", step)
        demos = self._demonstrations() if cfg.train.demo_coef > 0 else ()
        if group is not None:  # data-parallel ranks train; their weights come back here
            update = group.train_step(trainable, self.pad_id, temperature, seed, clip_high, token_advantages)
            group.pull_weights(self.policy, self.modules)
        else:
            update = train_step(
                self.policy,
                self.optimizer,
                self.scheduler,
                trainable,
                cfg.train,
                self.pad_id,
                temperature,
                value_head=self.modules.get("value_head"),
                seed=seed,
                clip_high=clip_high,
                token_advantages=token_advantages,
                demos=demos,
                replay=self.replay,
            )
        synced = time.perf_counter()
        self.engine.update_weights(self.policy)
        update["weights_sync_s"] = time.perf_counter() - synced
        release_free_memory()
        return update

    def _count_role_usage(self) -> dict[str, float]:
        """Add what the roles spent since the last count to the run's totals; the totals as metrics
        (``roles/NAME_tokens``: prompt and completion tokens so far)."""
        totals = self.state.role_usage
        for name, client in self.used_roles.items():
            usage = client.usage.as_dict() if getattr(client, "usage", None) is not None else None
            if usage is None:  # a client that does not count
                continue
            counted = self._role_usage_counted.get(name, {})
            total = totals.setdefault(name, {})
            for key, value in usage.items():
                total[key] = total.get(key, 0) + value - counted.get(key, 0)
            self._role_usage_counted[name] = usage
        return {
            f"roles/{name}_tokens": float(t.get("prompt_tokens", 0) + t.get("completion_tokens", 0))
            for name, t in totals.items()
        }

    def _last_step(self, step: int) -> bool:
        """Whether ``step`` ends the run (its final eval and checkpoint follow)."""
        return step == self.config.train.steps

    def _no_update(self, step: int, sampled: Sequence[Trajectory]) -> dict[str, float]:
        """The update metrics of a step left with nothing to train on (said why)."""
        tc = self.config.train
        why = (
            "no group had rewards that differ (dynamic sampling)"
            if tc.dynamic_sampling and sampled
            else f"every trajectory failed (rollout.on_failure={self.config.rollout.on_failure})"
        )
        self.reporter.message(f"step {step}: {why}; no update")
        return {"loss": 0.0, "grad_norm": 0.0, "update_skipped": 1.0}

    def _finish_step(self, step: int, metrics: dict[str, Any], tracker: Tracker) -> None:
        """After a step's update: the held-out eval when due, the metrics line, the progress, and
        the checkpoint and summary when due."""
        tc = self.config.train
        t2 = time.perf_counter()
        last = self._last_step(step)
        if last or (tc.eval_every and step % tc.eval_every == 0):
            metrics["eval/success"] = self.evaluate(f"step_{step:06d}", step)
            metrics["eval_s"] = time.perf_counter() - t2
        metrics.update(self._count_role_usage())
        for part, seconds in (
            ("rollout", metrics["rollout_s"]),
            ("update", metrics["update_s"]),
            ("eval", metrics.get("eval_s", 0.0)),
        ):
            self.state.rl_seconds[part] = self.state.rl_seconds.get(part, 0.0) + seconds
        metrics["wall_s"] = self._wall()
        tracker.log(step, metrics)
        self.reporter.advance(
            step=step,
            reward=metrics["reward_mean"],
            success=metrics["success_rate"],
            loss=metrics["loss"],
        )
        if last or (tc.save_every and step % tc.save_every == 0):
            self._save(step)
        if "eval/success" in metrics:
            self.write_summary(final=False)
            plot_curves(self.run_dir)
