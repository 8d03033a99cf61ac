"""`horizon train`: base eval → optional SFT warm start → eval → GRPO steps with periodic evals.

The run directory (docs/training.md) is written as the run goes: the resolved config first, then per
step one trajectory file, one ``metrics.jsonl`` line (fsynced) and TensorBoard scalars, and a
checkpoint every ``train.save_every`` steps — including step 0, right after the warm start and the
starting eval, so an interrupted run never repeats them. ``summary.json`` and ``curves.png`` are
rewritten after every eval, so a stopped run still has both. Ctrl-C saves the last finished step.

Two copies of the weights exist: the float32 policy the optimizer updates (LoRA adapters by default)
and the sampling model inside the engine (``engine.dtype``, bfloat16 by default), refreshed from the
policy after every optimizer step with ``engine.update_weights``.

:class:`TrainingRun` wires a run from its config and takes it to its starting point (fresh, resumed,
or started from another run's start; the warm start is :mod:`horizonrl.train.warm_start`); the steps
are :class:`~horizonrl.train.step_loop.StepLoop`'s, with the run's features plugged in as hooks
(:mod:`horizonrl.train.step_hooks`, :mod:`horizonrl.train.training_hooks`). A run mode beyond plain
training (``horizon stream``) hands its own schedule and hooks in instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from horizonrl.agent.loop import Agent
from horizonrl.config import RunConfig
from horizonrl.engine.factory import apply_memory_settings
from horizonrl.envs.factory import env_factory, eval_tasks, make_tasks
from horizonrl.errors import ConfigError
from horizonrl.io import replace_dir_atomic
from horizonrl.memory import peak_rss_gib
from horizonrl.models import load_base
from horizonrl.policy import AdapterStage, write_policy
from horizonrl.rollout.base import RolloutResult
from horizonrl.rollout.stats import summarize
from horizonrl.seeds import derive_seed
from horizonrl.serve.external import episode_agent
from horizonrl.train.checkpoint import (
    POLICY_DIR,
    latest_checkpoint,
    load_training_state,
    policy_dir,
    save_checkpoint,
)
from horizonrl.train.constrained import policy_replay
from horizonrl.train.dynamic_sampling import AllKept, DynamicSampling
from horizonrl.train.eval_records import interval_fields, success_estimate, task_outcomes
from horizonrl.train.interrupt import stop_on_signals
from horizonrl.train.reporter import Reporter
from horizonrl.train.role_usage import RoleUsage
from horizonrl.train.run_lock import hold_run_dir
from horizonrl.train.run_state import RunState
from horizonrl.train.rundir import Start, borrowed_start, check_fresh, claim_run_dir, resume_start
from horizonrl.train.sampler import sample_episodes
from horizonrl.train.sft import gather_demos
from horizonrl.train.step_hooks import FixedSteps, StepHook, StepSchedule
from horizonrl.train.step_loop import StepLoop
from horizonrl.train.summary import write_summary
from horizonrl.train.tracking import Tracker, plot_curves
from horizonrl.train.tracking_backends import ExternalTracking, check_tracking
from horizonrl.train.training_hooks import role_stages, training_hooks
from horizonrl.train.warm_start import copy_sft_adapter, restore_sft, sft_warm_start
from horizonrl.train.workers import worker_backend
from horizonrl.trainable import build_policy
from horizonrl.types import Task, Trajectory


def check_run_flags(resume: bool, overwrite: bool, start_from: Path | None) -> None:
    """Refuse the command-line flags that contradict each other."""
    if resume and overwrite:
        raise ConfigError(
            "--resume continues a run and --overwrite replaces it (moving it to output_dir/.trash): "
            "pass one of them"
        )
    if resume and start_from is not None:
        raise ConfigError("--resume continues a run and --start-from begins a new one: pass one of them")


class TrainingRun:
    """One `horizon train` invocation over a run directory."""

    def __init__(
        self,
        config: RunConfig,
        reporter: Reporter | None = None,
        resume: bool = False,
        overwrite: bool = False,
        start_from: Path | None = None,
        *,
        schedule: StepSchedule | None = None,
        hooks: Sequence[StepHook] | None = None,
    ) -> None:
        """``schedule`` and ``hooks``: a run mode's (a stream's) instead of training's own, which are
        ``train.steps`` steps over the training tasks with the hooks the config switches on."""
        check_run_flags(resume, overwrite, start_from)
        #: another run whose starting point (base eval, SFT, start eval) this run reuses
        self.start_from = Path(start_from) if start_from is not None else None
        self.config = config
        self.overwrite = overwrite
        self.schedule = schedule
        self.mode_hooks = list(hooks) if hooks is not None else None
        #: the features plugged into the steps (built with the run's parts)
        self.hooks: list[StepHook] = []
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
        self.saved_step = -1  # the step of the last checkpoint written (-1: none yet)
        #: adapters trained before the RL adapter and merged into ``self.base`` (the SFT adapter)
        self.stages: list[AdapterStage] = []
        self._borrowed: Start | None = None  # the --start-from run's step-0 checkpoint, once checked
        self.trainer_group: Any = None  # the data-parallel trainer ranks, when the backend has them
        self._demos: list[Trajectory] | None = None  # sft.demos, gathered once (SFT, train.demo_coef)
        self.stop_signal: str | None = None  # the name of the signal that asked the run to stop
        self.tracking = ExternalTracking(self.run_dir, self.reporter.message)  # MLflow, W&B (tracking:)

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
        apply_memory_settings(cfg.engine)
        asyncio.run(env_factory(cfg.env)().close())  # the env builds before a run directory is touched
        loaded = load_base(cfg.model)
        self.base, self.tokenizer, self.base_identity = loaded.base, loaded.tokenizer, loaded.identity
        self.backend = worker_backend(cfg)  # local, or workers on a Ray cluster (joined or started here)
        self.engine = self.backend.engine(self.base, self.tokenizer)
        self.agent = Agent(self.tokenizer, self.engine, cfg.sampling, cfg.agent, self.engine.max_context)
        #: who plays the episodes: the agent loop, or a user's program through the policy server
        self.player = episode_agent(cfg, self.engine, self.tokenizer, self.agent, self.run_dir / "external")
        self.env_factory = self.backend.env_factory()
        self.pad_id = self.engine.pad_token_id
        ev = cfg.eval
        self.eval_tasks = eval_tasks(cfg.env, ev.split, ev.num_tasks, ev.seed, ev.tasks)
        stages = role_stages(cfg, self.engine, self.tokenizer, self.env_factory)
        self.experience, self.attribution = stages.experience, stages.attribution
        #: the LLM roles this run asks (name -> client), whose calls and tokens it counts
        self.used_roles = stages.used_roles
        self.role_usage = RoleUsage(self.used_roles)
        #: the run mode's hooks, or training's as the config switches them on
        self.hooks = (
            self.mode_hooks
            if self.mode_hooks is not None
            else training_hooks(cfg, stages, lambda: self.engine.weights_version, self.run_dir)
        )

    def _wrap_policy(self) -> None:
        """The RL policy on ``self.base`` (:func:`~horizonrl.trainable.build_policy`), with its value
        head, optimizer and schedule; every trainer rank builds the same. Its initialisation depends on
        the run seed alone, not on what consumed random numbers before (an SFT stage, or a run
        started from another's start)."""
        cfg = self.config
        built = build_policy(
            self.base,
            cfg.model,
            optim=cfg.train,
            critic=cfg.train.critic,
            init_seed=derive_seed(cfg.seed, "policy_init"),
        )
        self.policy, self.modules = built.model, built.modules
        self.optimizer, self.scheduler = built.optimizer, built.scheduler
        #: rebuilds the masks of constrained turns for the update (agent.constrain)
        self.replay = policy_replay(self.config.agent.constrain, self.tokenizer, self.base)

    # ------------------------------------------------------------------ stages
    def rollouts(
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
        self.reporter.stage(label, len(tasks) * samples)
        before = self.engine.stats
        result = sample_episodes(
            self.player,
            self.env_factory,
            tasks,
            samples,
            concurrency,
            sampling=sampling,
            mode=self.config.rollout.mode,
            limits=self.config.rollout.limits(concurrency),
            out=out,
            append=append,
            on_done=lambda solved, done: self.reporter.advance(success=solved),
            on_status=self.reporter.status,
            notes=notes,
            eta=self.config.experience.eta,
        )
        after = self.engine.stats

        def grew(key: str) -> float:  # an engine in another process counts no decode steps or batches
            return float(after.get(key, 0.0) - before.get(key, 0.0))

        steps = grew("decode_steps")
        result.metrics["engine/mean_batch_size"] = grew("decode_rows") / steps if steps else 0.0
        result.metrics["engine/batches"] = grew("batches")
        self.state.generated_tokens += int(grew("generated_tokens"))
        return result

    def evaluate(self, label: str, step: int) -> float:
        ev = self.config.eval
        sampling = self.config.sampling.model_copy(update={"temperature": ev.temperature})
        out = self.run_dir / "eval" / f"{label}.jsonl"
        n = ev.samples_per_task  # a task's n samples (eval.samples_per_task); success is their mean
        trajs = self.rollouts(self.eval_tasks, n, sampling, out, f"eval {label}", ev.concurrency)
        success = summarize(trajs)["success_rate"]
        interval = success_estimate(task_outcomes(trajs))
        self.state.evals[str(step)] = success
        self.state.eval_intervals[str(step)] = [interval.low, interval.high]
        self.reporter.message(
            f"held-out success ({label}, {len(self.eval_tasks)} tasks{f' × {n}' if n > 1 else ''}): "
            f"{success:.1%} "
            f"[95% {interval.low:.1%}, {interval.high:.1%}, {interval.method}]"
        )
        return success

    def warm_start(self) -> None:
        """SFT on demonstrations, then merge the SFT adapter into the base weights (the RL start)."""
        self.reporter.stage("demos", None)
        demos = self.demonstrations()
        self.engine.drop_caches()  # the eval's KV caches are not needed while training
        start = sft_warm_start(
            self.config,
            self.base,
            demos,
            self.pad_id,
            self.tokenizer,
            self.base_identity,
            self.run_dir,
            self.reporter,
        )
        self.base, self.stages = start.base, start.stages
        self.engine.update_weights(self.base, self.stages)
        self.state.sft = True
        self.reporter.message(
            f"SFT: {len(demos)} demonstrations, {len(start.history)} steps, "
            f"final loss {start.history[-1]['loss']:.3f}"
        )

    def demonstrations(self) -> list[Trajectory]:
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
        self.state.eval_intervals = {k: v for k, v in saved.eval_intervals.items() if k == "0"}
        if saved.sft:  # model.finetune is lora (checked by _start_checkpoint)
            copy_sft_adapter(source, self.run_dir)
            self.state.sft = True
            self._restore_sft()
            self.engine.update_weights(self.base, self.stages)
        self.reporter.message(
            f"starting from {source}: base {saved.base_success:.1%}, start {saved.start_success:.1%}"
        )

    def _restore_sft(self) -> None:
        if self.state.sft and self.config.model.finetune == "lora":
            self.base, self.stages = restore_sft(self.run_dir, self.base)

    # ------------------------------------------------------------------ bookkeeping
    def _write_extras(self, checkpoint: Path) -> None:
        """What the hooks' stages keep in a checkpoint beside the weights."""
        for hook in self.hooks:
            hook.write_extras(checkpoint)

    def save(self, step: int) -> None:
        """A checkpoint of ``step``: the policy, optimizer, run state and the hooks' extras."""
        group = self.trainer_group
        if group is not None:  # the optimizer lives in the ranks; the checkpoint holds rank 0's
            group.pull_optimizer(self.optimizer, self.scheduler)
        for hook in self.hooks:
            hook.on_save(self.state)
        self.state.step = step
        self.state.wall_s = self.wall()
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
            write_extras=self._write_extras,
        )
        self.saved_step = step

    def wall(self) -> float:
        """The run's seconds so far, every session of it."""
        return self._wall_before + (time.perf_counter() - self._session_start)

    def write_summary(self, final: bool) -> dict[str, Any]:
        """Write ``summary.json`` (:func:`~horizonrl.train.summary.write_summary`) and return it."""
        extras: dict[str, Any] = {}
        for hook in self.hooks:
            extras.update(hook.summary())
        extras.update(self.tracking.summary())
        return write_summary(
            self.run_dir,
            self.config,
            self.state,
            final=final,
            eval_tasks=len(self.eval_tasks),
            wall=self.wall(),
            stage_peaks=self.stage_peaks,
            stage_seconds=self.stage_seconds,
            extras=extras,
        )

    def publish_policy(self) -> None:
        """Copy the last checkpoint's policy to ``run_dir/policy`` (the run's result)."""
        last = latest_checkpoint(self.run_dir)
        if last is not None:
            replace_dir_atomic(self.run_dir / POLICY_DIR, lambda out: shutil.copytree(policy_dir(last), out))

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

    def request_stop(self, name: str) -> None:
        self.stop_signal = name

    def check_stop(self) -> None:
        """Stop at a phase boundary if a signal came while a phase absorbed its interrupt."""
        if self.stop_signal is not None:
            raise KeyboardInterrupt

    def run(self) -> dict[str, Any]:
        """The whole run (see the module doc); the backend's workers are stopped however it ends.
        SIGTERM and Ctrl-C stop it where it is (:mod:`horizonrl.train.interrupt`), after saving the
        last finished step. The run directory's lock (:mod:`horizonrl.train.run_lock`) is held from
        before anything loads to the end: a second writer of the run is refused."""
        with hold_run_dir(self.run_dir):
            try:
                with stop_on_signals(self.request_stop):
                    return self._run()
            except BaseException as exc:  # the MLflow and W&B runs end with the run, however it ends
                self.tracking.finish("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
                raise
            finally:
                backend = getattr(self, "backend", None)
                if backend is not None:
                    backend.close()

    def _run(self) -> dict[str, Any]:
        start = self._check_dir()
        check_tracking(self.config)  # a backend not installed, an MLflow server that does not answer
        self.reporter.stage("loading model", None)
        with self._stage("load"):
            self._build()
        seeded: dict[str, float] = {}
        if start is None:
            self._claim_dir()
            if self.start_from is not None:
                self._adopt_start(self.start_from)
            else:
                self._reach_start()
            self._wrap_policy()
            for hook in self.hooks:
                seeded.update(hook.on_fresh_start())
            self.save(0)
        else:
            self._resume(start)
        self.tracking.open(self.config, resume=start is not None)
        resume_step = self.state.step if start is not None else None
        tb = "tensorboard" in self.config.tracking
        with Tracker(self.run_dir, resume_step, tb, sinks=[self.tracking]) as tracker:
            if start is None:
                tracker.log(
                    0,
                    {
                        "eval/success": self.state.start_success,
                        "eval/base_success": self.state.base_success,
                        **interval_fields(self.state.eval_intervals, 0),
                        **seeded,
                    },
                )
            self.write_summary(final=False)
            try:
                self._steps(tracker)
            except KeyboardInterrupt:
                if self.state.step > self.saved_step:
                    self.save(self.state.step)
                self.write_summary(final=False)
                raise
        self.publish_policy()
        summary = self.write_summary(final=True)
        plot_curves(self.run_dir)
        self.tracking.finish("FINISHED", summary)
        return summary

    def _resume(self, start: Start) -> None:
        """Back to the state of the checkpoint ``start`` names: weights, optimizer, schedule, the
        hooks' extras, and the engine's sampling weights."""
        ckpt = start.checkpoint
        self.state = RunState.from_dict(start.state)
        self._wall_before = self.state.wall_s
        self._restore_sft()
        self._wrap_policy()
        load_training_state(ckpt, self.optimizer, self.policy, self.modules)
        for hook in self.hooks:
            hook.load(ckpt)
        if self.state.scheduler:
            self.scheduler.load_state_dict(self.state.scheduler)
        self.engine.update_weights(self.policy, self.stages)
        self.saved_step = self.state.step
        self.reporter.message(f"resumed from {ckpt} (step {self.state.step})")

    def _steps(self, tracker: Tracker) -> None:
        """The RL steps (:class:`~horizonrl.train.step_loop.StepLoop`): the run mode's schedule, or
        ``train.steps`` steps over a stream of training tasks (enough for every sampling round)."""
        cfg, tc = self.config, self.config.train
        selector = (
            DynamicSampling(tc.tasks_per_step, tc.max_sampling_rounds)
            if tc.dynamic_sampling
            else AllKept(tc.tasks_per_step)
        )
        schedule = self.schedule
        if schedule is None:
            count = max(tc.steps, 1) * tc.tasks_per_step * selector.rounds
            schedule = FixedSteps(make_tasks(cfg.env, cfg.rollout.split, count, cfg.rollout.seed), tc.steps)
        StepLoop(self, schedule, self.hooks, selector).run_steps(tracker)
