"""The experience-stream benchmark: calc tasks arrive continuously in a task file, `horizon stream`
acts on them and learns, a synthetic rater gives thumbs up/down by hidden weights over the grounded
signals, and the stream is stopped with SIGTERM after a fixed time.

    python benchmarks/stream.py [--minutes 30] [--every 60] [--batch 8] [--quick] [KEY=VALUE ...]

A feeder appends ``--batch`` generated calc tasks to ``runs/<name>_tasks.jsonl`` every ``--every``
seconds (the stream follows the file). Prints one line per update (stream time, tasks so far, success
and rewards of the update's episodes, the weights, the cosine between the weights and the rater's
hidden weights, held-out success where an eval ran), then ``name=value`` lines: the first and last
updates' figures, the weight path's endpoints, and how long the SIGTERM stop took. Writes
``docs/img/stream_calc.png`` (reward and success over stream time; the weight path) unless
``--quick``, which uses the tiny random model on the toy settings (a check of the machinery).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HORIZON = [sys.executable, "-m", "horizonrl.cli"]
#: the synthetic rater's hidden weights: success first, then the step credit, and fewer tokens
HIDDEN = {"success": 1.0, "reward": 0.5, "tokens": -4.0}
QUICK = [
    "model.path=tiny-random",
    "sft.enabled=false",
    "eval.num_tasks=2",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "sampling.max_new_tokens=16",
    "agent.max_turns=2",
]


def feed(path: Path, config, batch: int, every: float, stop: threading.Event, k: int = 0) -> None:
    """Append ``batch`` fresh calc tasks to ``path`` every ``every`` seconds until ``stop`` (batch
    numbers from ``k``)."""
    from horizonrl.envs.factory import make_tasks

    while not stop.is_set():
        tasks = make_tasks(config.env, "train", batch, 10_000 + k)
        with path.open("a", encoding="utf-8") as f:
            f.write(
                "".join(
                    t.model_copy(update={"id": f"fed-{k}-{i}"}).model_dump_json() + "\n"
                    for i, t in enumerate(tasks)
                )
            )
        k += 1
        stop.wait(every)


def cosine(a: dict[str, float], b: dict[str, float]) -> float:
    keys = set(a) | set(b)
    dot = sum(a.get(k, 0.0) * b.get(k, 0.0) for k in keys)
    na = math.sqrt(sum(v * v for v in a.values()))
    nb = math.sqrt(sum(v * v for v in b.values()))
    return dot / (na * nb) if na and nb else 0.0


def weights_of(row: dict) -> dict[str, float]:
    prefix = "stream/weight/"
    return {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix)}


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["stream/time_s"] / 60 for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(minutes, [r["success_rate"] for r in rows], "o-", label="success (update's episodes)")
    a.plot(minutes, [r["stream/signal/reward"] for r in rows], "s-", label="env reward (mean)")
    a.plot(minutes, [r["stream/reward_mean"] for r in rows], "^-", label="stream reward w·s (mean)")
    evals = [(m, r["eval/success"]) for m, r in zip(minutes, rows, strict=True) if "eval/success" in r]
    if evals:
        a.plot(*zip(*evals, strict=True), "kD--", label="held-out success")
    a.set_xlabel("stream time (min)")
    a.set_title("calc stream: reward over time")
    a.legend(fontsize=8)
    for name in weights_of(rows[0]):
        b.plot(minutes, [r[f"stream/weight/{name}"] for r in rows], "o-", label=f"w[{name}]")
    agree = [
        (m, r["stream/pair_agreement"])
        for m, r in zip(minutes, rows, strict=True)
        if "stream/pair_agreement" in r
    ]
    if agree:
        b.plot(*zip(*agree, strict=True), "k--", label="rater's pairs the weights order right")
    b.set_xlabel("stream time (min)")
    b.set_title("reward weights under the synthetic rater")
    b.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def replay(run_dir: Path, seeds: int, config) -> None:
    """The outer loop alone, replayed on a finished stream's episodes with ``seeds`` rater seeds (which
    episodes get rated differs per seed): the weight path's end per seed, the mean and the worst."""
    import random
    import statistics

    from horizonrl.stream.signals import signal_vector
    from horizonrl.stream.weights import pair_agreement, rating_pairs, update_weights
    from horizonrl.types import read_trajectories

    s = config.stream
    names = s.signal_names()  # the weights' and the rater's (HIDDEN is the config's synthetic rater)
    initial = [s.weights.get(n, 0.0) for n in names]
    hidden = [HIDDEN.get(n, 0.0) for n in names]
    steps = sorted((run_dir / "trajectories").glob("step_*.jsonl"))
    ends = []
    for seed in range(seeds):
        rng = random.Random(seed)
        w, ratings = list(initial), []
        for path in steps:
            vectors = [signal_vector(t, names) for t in read_trajectories(path)]
            scores = [sum(a * b for a, b in zip(v, hidden, strict=True)) for v in vectors]
            median = statistics.median(scores)
            for i in rng.sample(range(len(vectors)), min(s.feedback.synthetic_per_step, len(vectors))):
                ratings.append((vectors[i], "up" if scores[i] >= median else "down"))
            ratings = ratings[-s.feedback.window :]
            w = update_weights(
                w,
                initial,
                rating_pairs(ratings),
                learning_rate=s.feedback.learning_rate,
                prior=s.feedback.prior,
                anchor=names.index(s.feedback.anchor),
                anchor_min=s.feedback.anchor_min,
                max_abs=s.feedback.max_abs,
            )
        cos = cosine(dict(zip(names, w, strict=True)), HIDDEN)
        agreement = pair_agreement(w, rating_pairs(ratings))
        agree = "-" if agreement is None else f"{agreement:.3f}"
        ends.append(cos)
        weights = " ".join(f"{n}={v:+.3f}" for n, v in zip(names, w, strict=True))
        print(f"replay_seed_{seed}: {weights} cos(w,hidden)={cos:.3f} pair_agreement={agree}")
    start = cosine(dict(zip(names, initial, strict=True)), HIDDEN)
    print(f"replay_cos_hidden_start={start:.3f}")
    print(f"replay_cos_hidden_end_mean={sum(ends) / len(ends):.3f}")
    print(f"replay_cos_hidden_end_worst={min(ends):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="Stream this long, then SIGTERM.")
    parser.add_argument("--every", type=float, default=60.0, help="Seconds between task arrivals.")
    parser.add_argument("--batch", type=int, default=8, help="Tasks per arrival.")
    parser.add_argument("--quick", action="store_true", help="The tiny random model: the machinery only.")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="Continue the stopped benchmark stream from its checkpoint (the task file keeps growing).",
    )
    parser.add_argument(
        "--replay",
        type=int,
        default=0,
        metavar="SEEDS",
        help="Only replay the outer loop on the finished stream's episodes with this many rater seeds.",
    )
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of configs/stream.yaml.")
    args = parser.parse_args()
    name = "stream_bench_quick" if args.quick else "stream_bench"
    hidden = "{" + ", ".join(f"{k}: {v}" for k, v in HIDDEN.items()) + "}"
    overrides = [
        f"name={name}",
        "stream.source.kind=file",
        "stream.source.max_wait_s=0",
        f"stream.feedback.synthetic={hidden}",
        *(QUICK if args.quick else []),
        *args.overrides,
    ]
    from horizonrl.config import load_config

    base = load_config(ROOT / "configs" / "stream.yaml", [o for o in overrides if "stream.source" not in o])
    tasks = (ROOT / base.output_dir / f"{name}_tasks.jsonl").resolve()
    tasks.parent.mkdir(parents=True, exist_ok=True)
    overrides.append(f"stream.source.path={tasks}")
    config = load_config(ROOT / "configs" / "stream.yaml", overrides)
    if args.replay:
        replay(config.run_dir, args.replay, config)
        return
    fed = 0
    if args.resume:
        fed = -(-sum(1 for _ in tasks.open()) // args.batch) if tasks.exists() else 0
    else:
        tasks.unlink(missing_ok=True)
    stop = threading.Event()
    feeder = threading.Thread(
        target=feed, args=(tasks, config, args.batch, args.every, stop, fed), daemon=True
    )
    feeder.start()
    cmd = [
        *HORIZON,
        "stream",
        str(ROOT / "configs" / "stream.yaml"),
        *overrides,
        "--resume" if args.resume else "--overwrite",
    ]
    print("$", " ".join(cmd[2:]), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + 60 * args.minutes
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=600)
    stop_s = time.monotonic() - signalled
    stop.set()
    run_dir = config.run_dir
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "stream/time_s" in r]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    print(
        "update  time_min  tasks  success  env_reward  stream_reward  "
        + "  ".join(weights_of(rows[0]))
        + "  cos(w,hidden)  heldout"
    )
    for r in rows:
        w = weights_of(r)
        held = f"{r['eval/success']:.2f}" if "eval/success" in r else "-"
        print(
            f"{r['step']:>6}  {r['stream/time_s'] / 60:8.1f}  {int(r['stream/tasks']):5d}  "
            f"{r['success_rate']:7.2f}  "
            f"{r['stream/signal/reward']:10.3f}  {r['stream/reward_mean']:13.3f}  "
            + "  ".join(f"{v:+.3f}" for v in w.values())
            + f"  {cosine(w, HIDDEN):13.3f}  {held}"
        )
    last = rows[-1]
    third = max(1, len(rows) // 3)
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"stream_exit_code={code}")
    print(f"stream_stop_s={stop_s:.1f}")
    print(f"stream_stopped_by={summary['stream']['stopped_by']}")
    print(f"stream_checkpoints={','.join(checkpoints)}")
    print(f"stream_policy={(run_dir / 'policy').is_dir()}")
    print(f"stream_updates={len(rows)}")
    print(f"stream_tasks={int(last['stream/tasks'])}")
    print(f"stream_minutes={last['stream/time_s'] / 60:.1f}")
    print(f"stream_success_first_third={mean(rows[:third], 'success_rate'):.3f}")
    print(f"stream_success_last_third={mean(rows[-third:], 'success_rate'):.3f}")
    print(f"stream_env_reward_first_third={mean(rows[:third], 'stream/signal/reward'):.3f}")
    print(f"stream_env_reward_last_third={mean(rows[-third:], 'stream/signal/reward'):.3f}")
    print(f"stream_tokens_k_first_third={mean(rows[:third], 'stream/signal/tokens'):.4f}")
    print(f"stream_tokens_k_last_third={mean(rows[-third:], 'stream/signal/tokens'):.4f}")
    print(f"stream_heldout={summary.get('evals')}")
    print("stream_weights_start=" + json.dumps(summary["stream"]["initial_weights"]))
    print(
        "stream_weights_end=" + json.dumps({k: round(v, 3) for k, v in summary["stream"]["weights"].items()})
    )
    print(f"stream_cos_hidden_start={cosine(summary['stream']['initial_weights'], HIDDEN):.3f}")
    print(f"stream_cos_hidden_end={cosine(summary['stream']['weights'], HIDDEN):.3f}")
    print(f"stream_ratings={summary['stream']['ratings']}")
    agree = [r["stream/pair_agreement"] for r in rows if "stream/pair_agreement" in r]
    if agree:
        print(f"stream_pair_agreement_first={agree[0]:.3f}")
        print(f"stream_pair_agreement_last={agree[-1]:.3f}")
    if not args.quick:
        out = ROOT / "docs" / "img" / "stream_calc.png"
        plot(rows, out)
        print(f"plot={out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
