"""The training loop: one RL step after another, with the run's features plugged in as hooks.

Per step (:meth:`StepLoop.step`): the schedule's tasks are rolled out in sampling rounds (each round
with its own derived seed, its records appended to ``trajectories/step_N.jsonl``), the failure policy
and the ``rewards`` hooks applied to each round and the selector (:mod:`horizonrl.train.dynamic_sampling`)
asked after it whether the step has enough; then the ``before_update`` hooks, the update
(:func:`~horizonrl.train.update.train_step`, in the data-parallel ranks when the backend has them;
the new weights then go to the engine), the ``after_update`` hooks, and the step's metrics line,
held-out eval and checkpoint when due, then the ``after_step`` hooks. The hook points are
:class:`~horizonrl.train.step_hooks.StepHook`'s.

The loop drives a built :class:`~horizonrl.train.run.TrainingRun` (``run``): its config, state,
reporter, engine and policy, its rollouts, evals, checkpoints and summary.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from horizonrl.memory import release_free_memory
from horizonrl.rollout.failures import apply_failure_policy
from horizonrl.rollout.stats import summarize
from horizonrl.seeds import derive_seed
from horizonrl.train.dynamic_sampling import AllKept
from horizonrl.train.eval_records import interval_fields
from horizonrl.train.step_hooks import StepBatch, StepHook, StepSchedule
from horizonrl.train.tracking import Tracker, plot_curves
from horizonrl.train.update import train_step
from horizonrl.types import Trajectory


class StepLoop:
    """The RL steps of ``run`` (module doc): tasks from ``schedule``, ``hooks`` called at their
    points in order, the trained-on groups chosen by ``selector``."""

    def __init__(
        self, run: Any, schedule: StepSchedule, hooks: Sequence[StepHook], selector: AllKept
    ) -> None:
        self.run = run
        self.schedule = schedule
        self.hooks = list(hooks)
        self.selector = selector

    def run_steps(self, tracker: Tracker) -> None:
        """Every step the schedule has left, inside every hook's ``around_steps``."""
        run = self.run
        if self.schedule.data_parallel:
            group = run.backend.trainer_group()
            if group is not None:  # the ranks start from exactly this policy and optimizer state
                group.load(run.stages, run.policy, run.modules, run.optimizer, run.scheduler)
                run.trainer_group = group
        with contextlib.ExitStack() as around:
            for hook in self.hooks:
                around.enter_context(hook.around_steps(run))
            step = run.state.step
            while self.schedule.has_next(step):
                step += 1
                self.step(step, tracker)

    def step(self, step: int, tracker: Tracker) -> None:
        """One RL step: rollouts, update, metrics, and the eval and checkpoint when due."""
        run = self.run
        run.check_stop()
        t0 = time.perf_counter()
        batch = self.sample(step)
        for hook in self.hooks:
            hook.before_update(step, batch)
        t1 = time.perf_counter()
        run.reporter.stage(self.schedule.update_label(step), None)
        update = self.update(step, batch)
        t2 = time.perf_counter()
        run.state.step = step
        self.schedule.commit(run.state)
        metrics: dict[str, Any] = {**summarize(batch.sampled), **batch.metrics, **update}
        metrics.update({"rollout_s": t1 - t0, "update_s": t2 - t1})
        for hook in self.hooks:
            hook.after_update(step, batch, metrics)
        self.finish(step, metrics, tracker)
        for hook in self.hooks:
            hook.after_step(step, metrics)

    def sample(self, step: int) -> StepBatch:
        """A step's rollouts, round after round until the selector has enough (module doc)."""
        run = self.run
        cfg, tc = run.config, run.config.train
        out = run.run_dir / "trajectories" / f"step_{step:06d}.jsonl"
        batch = StepBatch(step)
        for round_ in range(self.selector.rounds):
            tasks = self.schedule.tasks(run.state, step, round_, self.selector.need(round_))
            notes: dict[str, str] = {}
            for hook in self.hooks:
                notes.update(hook.before_rollout(step, tasks) or {})
            seed = derive_seed(cfg.seed, "rollout", step, round_)
            sampling = cfg.sampling.model_copy(update={"seed": seed})
            label = self.schedule.rollout_label(step, round_)
            rollout = run.rollouts(
                tasks, tc.group_size, sampling, out, label, tc.concurrency, append=round_ > 0, notes=notes
            )
            run.check_stop()  # an interrupted rollout is not trained on
            kept, round_metrics = apply_failure_policy(rollout, cfg.rollout.on_failure)
            for hook in self.hooks:
                kept = hook.rewards(step, rollout, kept, round_metrics)
            batch.sampled.extend(rollout)
            for key, value in {**rollout.metrics, **round_metrics}.items():
                summed = key.startswith("failures/")
                batch.metrics[key] = batch.metrics.get(key, 0.0) + value if summed else value
            if self.selector.take(round_, kept, batch):
                break
        self.selector.finish(batch)
        return batch

    def update(self, step: int, batch: StepBatch) -> dict[str, float]:
        """One :func:`~horizonrl.train.update.train_step` on the batch's trainable trajectories (in
        the data-parallel ranks when the backend has them), then the new weights to the engine; the
        update's metrics, or why there was none."""
        if not batch.trainable:
            return self.no_update(step, batch.sampled)
        run = self.run
        cfg, group = run.config, run.trainer_group
        run.engine.drop_caches()
        temperature, seed = cfg.sampling.temperature or 1.0, derive_seed(cfg.seed, "update", step)
        demos = run.demonstrations() if cfg.train.demo_coef > 0 else ()
        if group is not None:  # data-parallel ranks train; their weights come back here
            update = group.train_step(
                batch.trainable, run.pad_id, temperature, seed, batch.clip_high, batch.token_advantages
            )
            group.pull_weights(run.policy, run.modules)
        else:
            update = train_step(
                run.policy,
                run.optimizer,
                run.scheduler,
                batch.trainable,
                cfg.train,
                run.pad_id,
                temperature,
                value_head=run.modules.get("value_head"),
                seed=seed,
                clip_high=batch.clip_high,
                token_advantages=batch.token_advantages,
                demos=demos,
                replay=run.replay,
            )
        synced = time.perf_counter()
        run.engine.update_weights(run.policy, run.stages)
        update["weights_sync_s"] = time.perf_counter() - synced
        release_free_memory()
        return update

    def no_update(self, step: int, sampled: Sequence[Trajectory]) -> dict[str, float]:
        """The update metrics of a step left with nothing to train on (said why)."""
        failed = f"every trajectory failed (rollout.on_failure={self.run.config.rollout.on_failure})"
        why = self.selector.empty_reason(sampled) or failed
        self.run.reporter.message(f"step {step}: {why}; no update")
        return {"loss": 0.0, "grad_norm": 0.0, "update_skipped": 1.0}

    def finish(self, step: int, metrics: dict[str, Any], tracker: Tracker) -> None:
        """After a step's update: the held-out eval when due, the metrics line, the progress, and
        the checkpoint and summary when due."""
        run, tc = self.run, self.run.config.train
        t2 = time.perf_counter()
        last = self.schedule.is_last(step)
        if last or (tc.eval_every and step % tc.eval_every == 0):
            metrics["eval/success"] = run.evaluate(f"step_{step:06d}", step)
            metrics.update(interval_fields(run.state.eval_intervals, step))
            metrics["eval_s"] = time.perf_counter() - t2
        metrics.update(run.role_usage.count(run.state.role_usage))
        for part, seconds in (
            ("rollout", metrics["rollout_s"]),
            ("update", metrics["update_s"]),
            ("eval", metrics.get("eval_s", 0.0)),
        ):
            run.state.rl_seconds[part] = run.state.rl_seconds.get(part, 0.0) + seconds
        metrics["wall_s"] = run.wall()
        tracker.log(step, metrics)
        run.reporter.advance(
            step=step,
            reward=metrics["reward_mean"],
            success=metrics["success_rate"],
            loss=metrics["loss"],
        )
        if last or (tc.save_every and step % tc.save_every == 0):
            run.save(step)
        if "eval/success" in metrics:
            run.write_summary(final=False)
            plot_curves(run.run_dir)
