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
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from horizonrl.build import make_tasks
from horizonrl.config import RunConfig
from horizonrl.errors import ConfigError, DataError, iter_user_lines
from horizonrl.rollout.failures import apply_failure_policy
from horizonrl.rollout.stats import summarize
from horizonrl.seeds import derive_seed
from horizonrl.stream.feedback import Feedback, FeedbackReader, append_feedback
from horizonrl.stream.signals import as_vector, shape_rewards, signal_vector, weighted
from horizonrl.stream.sources import FileSource, GeneratorSource, SelfQuestioningSource, TaskSource
from horizonrl.stream.weights import Pair, pair_agreement, rating_pairs, update_weights
from horizonrl.train.interrupt import stop_on_signals
from horizonrl.train.run import Reporter, TrainingRun
from horizonrl.train.tracking import Tracker
from horizonrl.types import Trajectory


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


class StreamRun(TrainingRun):
    """One `horizon stream` invocation over a run directory (module doc)."""

    def __init__(
        self,
        config: RunConfig,
        reporter: Reporter | None = None,
        resume: bool = False,
        overwrite: bool = False,
        port: int | None = None,
    ) -> None:
        super().__init__(config, reporter, resume=resume, overwrite=overwrite)
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
        self.port = port
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

    def _save(self, step: int) -> None:
        if self.source is not None:
            self.state.stream = self._stream_state()
        super()._save(step)

    def _last_step(self, step: int) -> bool:
        s = self.config.stream
        if s.max_steps is not None and step >= s.max_steps:
            self.stopped_by = f"stream.max_steps={s.max_steps}"
        elif s.max_minutes is not None and self._wall() >= 60 * s.max_minutes:
            self.stopped_by = f"stream.max_minutes={s.max_minutes:g}"
        return self.stopped_by is not None

    def _summary_extras(self) -> dict[str, Any]:
        stream = {
            "source": self.source.describe() if self.source is not None else None,
            "signals": self.names,
            "initial_weights": dict(zip(self.names, self.initial, strict=True)),
            "weights": dict(zip(self.names, self.weights, strict=True)),
            **self.counts,
            "stopped_by": self.stopped_by,
        }
        return {"stream": stream}

    # ------------------------------------------------------------------ parts
    def _make_source(self) -> TaskSource:
        cfg = self.config
        src = cfg.stream.source
        if src.kind == "generator":
            return GeneratorSource(cfg, make_tasks)
        if src.kind == "file":
            assert src.path is not None
            env_names = {cfg.env.name, type(self.env_factory()).name}
            return FileSource(src.path, env_names, src.poll_s, src.max_wait_s, on_wait=self.reporter.status)
        from horizonrl.roles import Roles

        return SelfQuestioningSource(cfg, Roles(cfg.roles, self.engine, self.tokenizer))

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
            append_feedback(self.run_dir, Feedback(trajectory_id=tid, label=label, source="synthetic"))

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

    # ------------------------------------------------------------------ the loop
    def _loop(self, tracker: Tracker) -> None:
        self.source = self._make_source()
        self.feedback = FeedbackReader(self.run_dir)
        if self.state.stream:
            self._load_stream_state(self.state.stream)
        else:  # stream time counts from the first update, after the warm start and the start eval
            self.counts["start_wall_s"] = self._wall()
        self.reporter.message(
            f"streaming tasks from {self.source.describe()}; reward = "
            + " + ".join(f"{w:g}·{n}" for n, w in zip(self.names, self.weights, strict=True))
        )
        with self._viewer():
            step = self.state.step
            while not (step and self._last_step(step)):
                step += 1
                self._update(step, tracker)
        if self.stopped_by is not None:
            self.reporter.message(f"stream stopped by {self.stopped_by}")

    @contextlib.contextmanager
    def _viewer(self) -> Iterator[None]:
        """With ``--port``: the viewer (and its feedback API) on this run, served while it streams."""
        if self.port is None:
            yield
            return
        from horizonrl.view.app import create_app
        from horizonrl.view.server import ViewerServer

        with ViewerServer(create_app([self.run_dir]), port=self.port) as server:
            self.reporter.message(
                f"viewer and feedback API: {server.url} (POST /api/runs/<run>/feedback with "
                '{"trajectory_id": ..., "label": "up"|"down"})'
            )
            yield

    def _update(self, step: int, tracker: Tracker) -> None:
        cfg, tc = self.config, self.config.train
        assert self.source is not None
        self._check_stop()
        t0 = time.perf_counter()
        self.reporter.stage(f"tasks for update {step}", None)
        tasks = self.source.next_batch(tc.tasks_per_step)
        self.counts["tasks"] += len(tasks)
        sampling = cfg.sampling.model_copy(update={"seed": derive_seed(cfg.seed, "rollout", step, 0)})
        out = self.run_dir / "trajectories" / f"step_{step:06d}.jsonl"
        rollout = self._rollouts(tasks, tc.group_size, sampling, out, f"update {step}", tc.concurrency)
        self._check_stop()  # an interrupted rollout is not trained on
        kept, failure_metrics = apply_failure_policy(rollout, cfg.rollout.on_failure)
        self._remember(rollout)
        self._synthetic_ratings(step, rollout)
        feedback_metrics = self._outer_step()
        shaped = shape_rewards(kept, self.names, self.weights)
        t1 = time.perf_counter()
        self.reporter.stage(f"update {step}", None)
        update = self._update_policy(step, shaped, rollout)
        t2 = time.perf_counter()
        self.state.step = step
        metrics: dict[str, Any] = {**summarize(rollout), **rollout.metrics, **failure_metrics, **update}
        metrics.update(feedback_metrics)
        metrics["stream/reward_mean"] = sum(t.reward for t in shaped) / len(shaped) if shaped else 0.0
        metrics["stream/tasks"] = float(self.counts["tasks"])
        metrics["stream/time_s"] = self._wall() - self.counts["start_wall_s"]
        for name, weight in zip(self.names, self.weights, strict=True):
            metrics[f"stream/weight/{name}"] = weight
        for i, name in enumerate(self.names):
            values = [self.memory[t.id][i] for t in rollout if t.id in self.memory]
            metrics[f"stream/signal/{name}"] = sum(values) / len(values) if values else 0.0
        metrics.update({"rollout_s": t1 - t0, "update_s": t2 - t1})
        self._finish_step(step, metrics, tracker)
        weights = " ".join(f"{n}={w:+.2f}" for n, w in zip(self.names, self.weights, strict=True))
        self.reporter.message(
            f"update {step}: {len(tasks)} tasks · success {metrics['success_rate']:.0%} · "
            f"reward {metrics['stream/reward_mean']:+.3f} · weights {weights} · "
            f"{int(self.counts['ratings'])} ratings"
        )

    # ------------------------------------------------------------------ entry
    def run(self) -> dict[str, Any]:
        """Stream until a limit, SIGTERM or Ctrl-C; a stop by signal saves the last finished update,
        publishes ``policy/`` and returns the summary (``stopped_by``: the signal's name)."""
        with stop_on_signals(self._request_stop):
            try:
                return super().run()
            except KeyboardInterrupt:
                if self._saved_step < 0:  # nothing was written yet: nothing to keep
                    raise
                self.stopped_by = self.stop_signal or "SIGINT"
                self._publish_policy()
                return self.write_summary(final=False)
