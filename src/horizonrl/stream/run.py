"""`horizon stream`: a continual run. Per update, in this order:

1. the source hands out ``train.tasks_per_step`` tasks and the policy plays ``train.group_size``
   episodes of each (written to ``trajectories/step_N.jsonl`` as they finish);
2. the grounded signals of every episode are remembered (for ratings that arrive later);
3. feedback that arrived since the last update (``feedback.jsonl``: thumbs from the viewer's HTTP
   API, or the synthetic rater) is read, and when there is any — or a held-out preference set — the
   outer loop takes one step on the reward weights (:mod:`horizonrl.stream.weights`);
4. the inner loop: the policy update (``train.algorithm``) on ``reward = w · signals`` under the
   new weights.

It never ends on its own (unless ``stream.max_steps`` or ``stream.max_minutes`` say so): SIGTERM and
Ctrl-C stop it cleanly after saving the last finished update as a checkpoint (the weights, the
source's position, the feedback read so far) and publishing ``policy/``; ``--resume`` continues.

A stream is a training run (:class:`~horizonrl.train.run.TrainingRun`) with :class:`StreamHook` as its
schedule (tasks from the source, labelled per update, ended by the stream's limits) and its only hook:
steps 2-3 are its ``rewards`` point, the stream's metrics its ``after_update``, its state rides in
every checkpoint's run state (``on_save``) and its block in ``summary.json`` (``summary``).
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from horizonrl.config import RunConfig
from horizonrl.envs.factory import make_tasks
from horizonrl.errors import ConfigError, DataError, iter_user_lines
from horizonrl.seeds import derive_seed
from horizonrl.stream.feedback import Feedback, FeedbackReader, append_feedback
from horizonrl.stream.signals import as_vector, shape_rewards, signal_vector, weighted
from horizonrl.stream.sources import FileSource, GeneratorSource, SelfQuestioningSource, TaskSource
from horizonrl.stream.weights import Pair, pair_agreement, rating_pairs, update_weights
from horizonrl.train.interrupt import stop_on_signals
from horizonrl.train.reporter import Reporter
from horizonrl.train.run import TrainingRun, check_run_flags
from horizonrl.train.run_lock import hold_run_dir
from horizonrl.train.run_state import RunState
from horizonrl.train.step_hooks import StepBatch, StepHook
from horizonrl.types import Task, Trajectory


def read_preferences(path: Path, names: Sequence[str]) -> list[Pair]:
    """A held-out preference set: JSONL ``{"preferred": {signal: value}, "rejected": {...}}``."""
    pairs: list[Pair] = []
    for lineno, line in iter_user_lines(path, "preference file"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            pairs.append((as_vector(record["preferred"], names), as_vector(record["rejected"], names)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(
                f"{path}:{lineno}: not a preference pair ({exc}); expected "
                '{"preferred": {"success": 1, "tokens": 0.1}, "rejected": {...}}'
            ) from None
    if not pairs:
        raise DataError(f"preference file {str(path)!r} holds no pairs")
    return pairs


class StreamHook(StepHook):
    """A stream's part of the training loop: its schedule and its hook (module doc)."""

    #: the stream trains in the driver (the backend's trainer ranks are not loaded)
    data_parallel = False

    def __init__(
        self, config: RunConfig, viewer: Callable[[Path], AbstractContextManager[str]] | None = None
    ) -> None:
        tc, s = config.train, config.stream
        if tc.dynamic_sampling or tc.failure_penalties:
            raise ConfigError(
                "horizon stream: train.dynamic_sampling and train.failure_penalties are not supported "
                "in a stream (its reward is stream.weights over the grounded signals); turn them off"
            )
        if config.experience.enabled or config.attribution.enabled:
            raise ConfigError(
                "horizon stream: experience.enabled and attribution.enabled are not supported in a "
                "stream yet; turn them off"
            )
        self.config = config
        self.viewer = viewer
        self.names = s.signal_names()
        self.initial = [s.weights.get(n, 0.0) for n in self.names]
        self.weights = list(self.initial)
        self.anchor = self.names.index(s.feedback.anchor)
        self.preferences: list[Pair] = (
            read_preferences(s.feedback.preference_file, self.names) if s.feedback.preference_file else []
        )
        #: signal vectors of recent trajectories, by id (what a rating arriving later refers to)
        self.memory: OrderedDict[str, list[float]] = OrderedDict()
        #: the most recent ratings (signal vector, label), at most feedback.window
        self.ratings: list[tuple[list[float], str]] = []
        self.counts: dict[str, float] = {"ratings": 0, "stale_ratings": 0, "updates": 0, "tasks": 0}
        self.source: TaskSource | None = None
        self.feedback: FeedbackReader | None = None
        self.stopped_by: str | None = None
        self.run: Any = None  # the TrainingRun it streams in (from around_steps on)
        self._tasks = 0  # tasks of the current update
        self._feedback_metrics: dict[str, float] = {}  # the current update's outer step
        self._shaped: list[Trajectory] = []  # the current update's trajectories, as trained on

    # ------------------------------------------------------------------ state
    def _stream_state(self) -> dict[str, Any]:
        assert self.source is not None and self.feedback is not None
        return {
            "names": self.names,
            "weights": self.weights,
            "source": self.source.state(),
            "feedback_offset": self.feedback.offset,
            "memory": list(self.memory.items()),
            "ratings": self.ratings,
            "counts": self.counts,
        }

    def _load_stream_state(self, state: dict[str, Any]) -> None:
        if state.get("names") != self.names:
            raise ConfigError(
                f"--resume: the run weighted the signals {state.get('names')} but the config now weights "
                f"{self.names}; resume with the same stream.weights and stream.feedback.synthetic signals"
            )
        assert self.source is not None and self.feedback is not None
        self.weights = [float(w) for w in state["weights"]]
        self.source.load(state["source"])
        self.feedback.offset = int(state["feedback_offset"])
        self.memory = OrderedDict((k, list(v)) for k, v in state["memory"])
        self.ratings = [(list(v), str(label)) for v, label in state["ratings"]]
        self.counts.update(state["counts"])

    def on_save(self, state: RunState) -> None:
        if self.source is not None:
            state.stream = self._stream_state()

    def summary(self) -> dict[str, Any]:
        stream = {
            "source": self.source.describe() if self.source is not None else None,
            "signals": self.names,
            "initial_weights": dict(zip(self.names, self.initial, strict=True)),
            "weights": dict(zip(self.names, self.weights, strict=True)),
            **self.counts,
            "stopped_by": self.stopped_by,
        }
        return {"stream": stream}

    # ------------------------------------------------------------------ the schedule
    def has_next(self, step: int) -> bool:
        return not (step and self.is_last(step))

    def is_last(self, step: int) -> bool:
        s = self.config.stream
        if s.max_steps is not None and step >= s.max_steps:
            self.stopped_by = f"stream.max_steps={s.max_steps}"
        elif s.max_minutes is not None and self.run.wall() >= 60 * s.max_minutes:
            self.stopped_by = f"stream.max_minutes={s.max_minutes:g}"
        return self.stopped_by is not None

    def tasks(self, state: RunState, step: int, round_: int, count: int) -> list[Task]:
        assert self.source is not None
        self.run.reporter.stage(f"tasks for update {step}", None)
        tasks = self.source.next_batch(count)
        self.counts["tasks"] += len(tasks)
        self._tasks = len(tasks)
        return tasks

    def rollout_label(self, step: int, round_: int) -> str:
        return f"update {step}"

    def update_label(self, step: int) -> str:
        return f"update {step}"

    def commit(self, state: RunState) -> None:
        """Nothing: the source's position rides in the stream state of every checkpoint."""

    # ------------------------------------------------------------------ parts
    def _make_source(self) -> TaskSource:
        cfg, run = self.config, self.run
        src = cfg.stream.source
        if src.kind == "generator":
            return GeneratorSource(cfg, make_tasks)
        if src.kind == "file":
            assert src.path is not None
            env_names = {cfg.env.name, type(run.env_factory()).name}
            return FileSource(src.path, env_names, src.poll_s, src.max_wait_s, on_wait=run.reporter.status)
        from horizonrl.roles import Roles

        return SelfQuestioningSource(cfg, Roles(cfg.roles, run.engine, run.tokenizer))

    def _remember(self, trajectories: Sequence[Trajectory]) -> None:
        for traj in trajectories:
            self.memory[traj.id] = signal_vector(traj, self.names)
            self.memory.move_to_end(traj.id)
        while len(self.memory) > self.config.stream.remember:
            self.memory.popitem(last=False)

    def _synthetic_ratings(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        """The synthetic rater: ``synthetic_per_step`` of this update's trajectories, rated up when
        their hidden score is at least the update's median, written to feedback.jsonl."""
        fb = self.config.stream.feedback
        if fb.synthetic is None or not trajectories:
            return
        hidden = [fb.synthetic.get(n, 0.0) for n in self.names]
        scores = {t.id: weighted(self.memory[t.id], hidden) for t in trajectories if t.id in self.memory}
        if not scores:
            return
        median = statistics.median(scores.values())
        rng = random.Random(derive_seed(self.config.seed, "synthetic_rater", step))
        for tid in rng.sample(sorted(scores), min(fb.synthetic_per_step, len(scores))):
            label = "up" if scores[tid] >= median else "down"
            append_feedback(self.run.run_dir, Feedback(trajectory_id=tid, label=label, source="synthetic"))

    def _outer_step(self) -> dict[str, float]:
        """Read the ratings that arrived; one weight update when there are new ones (or a preference set)."""
        fb = self.config.stream.feedback
        assert self.feedback is not None
        new = 0
        for rating in self.feedback.read_new():
            vector = self.memory.get(rating.trajectory_id)
            if vector is None:
                self.counts["stale_ratings"] += 1
                continue
            self.ratings.append((vector, rating.label))
            new += 1
        if self.feedback.refused:  # said each update until the link is gone
            self.run.reporter.message(f"feedback not read: {self.feedback.refused}")
        self.ratings = self.ratings[-fb.window :]
        self.counts["ratings"] += new
        pairs = rating_pairs(self.ratings) + self.preferences
        before = pair_agreement(self.weights, pairs)
        if new or self.preferences:
            self.weights = update_weights(
                self.weights,
                self.initial,
                pairs,
                learning_rate=fb.learning_rate,
                prior=fb.prior,
                anchor=self.anchor,
                anchor_min=fb.anchor_min,
                max_abs=fb.max_abs,
            )
            self.counts["updates"] += 1
        metrics = {
            "stream/new_ratings": float(new),
            "stream/ratings": float(self.counts["ratings"]),
            "stream/stale_ratings": float(self.counts["stale_ratings"]),
            "stream/bad_feedback_lines": float(self.feedback.bad_lines),
            "stream/weight_updates": float(self.counts["updates"]),
        }
        if before is not None:
            metrics["stream/pair_agreement"] = before  # of the weights the ratings were given under
        return metrics

    # ------------------------------------------------------------------ the hook points
    @contextlib.contextmanager
    def around_steps(self, run: Any) -> Iterator[None]:
        """The source, the feedback reader and the stream state (on a resume), then the viewer
        served while the updates run."""
        self.run = run
        self.source = self._make_source()
        self.feedback = FeedbackReader(run.run_dir)
        if run.state.stream:
            self._load_stream_state(run.state.stream)
        else:  # stream time counts from the first update, after the warm start and the start eval
            self.counts["start_wall_s"] = run.wall()
        run.reporter.message(
            f"streaming tasks from {self.source.describe()}; reward = "
            + " + ".join(f"{w:g}·{n}" for n, w in zip(self.names, self.weights, strict=True))
        )
        with self._viewer():
            yield
        if self.stopped_by is not None:
            run.reporter.message(f"stream stopped by {self.stopped_by}")

    @contextlib.contextmanager
    def _viewer(self) -> Iterator[None]:
        """The viewer (and its feedback API) on this run, served while it streams (``--port``)."""
        if self.viewer is None:
            yield
            return
        with self.viewer(self.run.run_dir) as url:
            self.run.reporter.message(
                f"viewer and feedback API: {url} (POST /api/runs/<run>/feedback with "
                '{"trajectory_id": ..., "label": "up"|"down"})'
            )
            yield

    def rewards(
        self, step: int, rollout: Sequence[Trajectory], kept: list[Trajectory], metrics: dict[str, float]
    ) -> list[Trajectory]:
        """Remember every episode's signals, rate some (the synthetic rater), take the outer step on
        the weights with the ratings that arrived, and reward ``kept`` as ``w · signals``."""
        self._remember(rollout)
        self._synthetic_ratings(step, rollout)
        self._feedback_metrics = self._outer_step()
        self._shaped = shape_rewards(kept, self.names, self.weights)
        return self._shaped

    def after_update(self, step: int, batch: StepBatch, metrics: dict[str, Any]) -> None:
        shaped = self._shaped
        metrics.update(self._feedback_metrics)
        metrics["stream/reward_mean"] = sum(t.reward for t in shaped) / len(shaped) if shaped else 0.0
        metrics["stream/tasks"] = float(self.counts["tasks"])
        metrics["stream/time_s"] = self.run.wall() - self.counts["start_wall_s"]
        for name, weight in zip(self.names, self.weights, strict=True):
            metrics[f"stream/weight/{name}"] = weight
        for i, name in enumerate(self.names):
            values = [self.memory[t.id][i] for t in batch.sampled if t.id in self.memory]
            metrics[f"stream/signal/{name}"] = sum(values) / len(values) if values else 0.0

    def after_step(self, step: int, metrics: dict[str, Any]) -> None:
        weights = " ".join(f"{n}={w:+.2f}" for n, w in zip(self.names, self.weights, strict=True))
        self.run.reporter.message(
            f"update {step}: {self._tasks} tasks · success {metrics['success_rate']:.0%} · "
            f"reward {metrics['stream/reward_mean']:+.3f} · weights {weights} · "
            f"{int(self.counts['ratings'])} ratings"
        )


class StreamRun:
    """One `horizon stream` invocation over a run directory (module doc)."""

    def __init__(
        self,
        config: RunConfig,
        reporter: Reporter | None = None,
        resume: bool = False,
        overwrite: bool = False,
        viewer: Callable[[Path], AbstractContextManager[str]] | None = None,
    ) -> None:
        """``viewer``: serves the viewer and its feedback API on a run directory while the stream
        runs (entered, it gives the viewer's URL); None: no viewer."""
        check_run_flags(resume, overwrite, None)
        self.stream = StreamHook(config, viewer)
        self.training = TrainingRun(
            config, reporter, resume=resume, overwrite=overwrite, schedule=self.stream, hooks=[self.stream]
        )

    def run(self) -> dict[str, Any]:
        """Stream until a limit, SIGTERM or Ctrl-C; a stop by signal saves the last finished update,
        publishes ``policy/`` and returns the summary (``stopped_by``: the signal's name)."""
        training = self.training
        with hold_run_dir(training.run_dir), stop_on_signals(training.request_stop):
            try:
                return training.run()
            except KeyboardInterrupt:
                if training.saved_step < 0:  # nothing was written yet: nothing to keep
                    raise
                self.stream.stopped_by = training.stop_signal or "SIGINT"
                training.publish_policy()
                return training.write_summary(final=False)
