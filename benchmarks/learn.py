"""The component-centric learning benchmark: every method (selection x optimization x target, and
SFT/GRPO on the model) on calc and two worlds with the embedded model, the environment-adaptive
choice against the best single method and the upper bound, and a UCB bandit against the even split.

    python benchmarks/learn.py [--quick] [KEY=VALUE ...]

Runs ``horizon learn configs/learn.yaml`` (resuming a stopped run of the same recipe), then prints
``name=value`` lines from its ``learn.json``: each method's validation reward per env and its costs
(optimizer and evaluation tokens, wall seconds), the baseline, best single, adaptive and upper
bound per env and on average, the bandit's and the even split's, and how many optimizer replies
were kept. ``--quick`` uses a tiny random model, one world, one iteration (a check of the machinery).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HORIZON = [sys.executable, "-m", "horizonrl.cli"]
QUICK = [
    "name=learn_quick",
    "model.path=tiny-random",
    "learn.envs=[{name: world, options: {world: odd_one_out}, val_tasks: 2}]",
    "learn.iterations=1",
    "learn.train_tasks=2",
    "learn.optimizer_max_tokens=32",
    "learn.model.sft_num_demos=4",
    "learn.model.grpo_steps=1",
    "learn.model.grpo_tasks_per_step=2",
    "learn.model.grpo_group_size=2",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="A tiny random model: the machinery only.")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of configs/learn.yaml.")
    args = parser.parse_args()
    overrides = [*(QUICK if args.quick else []), *args.overrides]
    from horizonrl.config import load_config

    config = load_config(ROOT / "configs" / "learn.yaml", overrides)
    resume = ["--resume"] if (config.run_dir / "learn").is_dir() else []
    start = time.perf_counter()
    cmd = [*HORIZON, "learn", str(ROOT / "configs" / "learn.yaml"), *overrides, *resume]
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(done.returncode)
    wall = time.perf_counter() - start
    summary = json.loads((config.run_dir / "learn.json").read_text())
    envs = summary["envs_done"]
    for name, block in summary["methods"].items():
        cells = " ".join(f"{e}:{block['per_env'][e]['score']:.3f}" for e in envs)
        print(f"method_{name}={cells} mean:{block['mean']:.3f}")
    for name, block in summary["methods"].items():
        costs = [block["per_env"][e] for e in envs]

        def total(key: str, costs: list = costs) -> float:
            return sum(c[key] for c in costs)

        unchanged = _merge([c["unchanged"] for c in costs])
        print(
            f"cost_{name}=optimizer_tokens:{total('optimizer_tokens'):.0f} "
            f"eval_tokens:{total('eval_tokens'):.0f} wall_s:{total('wall_s'):.0f} "
            f"candidates:{total('candidates'):.0f} unchanged:{unchanged}"
        )
    for key in ("baseline", "best_single", "adaptive", "upper_bound"):
        block = summary[key]
        cells = " ".join(f"{e}:{block['per_env'][e]:.3f}" for e in envs)
        label = f" ({block['method']})" if key == "best_single" else ""
        print(f"{key}={cells} mean:{block['mean']:.3f}{label}")
    for e in envs:
        row = summary["per_env"][e]
        print(f"pick_{e}=adaptive:{row['adaptive']['method']} upper_bound:{row['upper_bound']['method']}")
    alloc = summary.get("allocation")
    if alloc:
        detail = alloc["bandit"]["detail"]
        for e in detail:
            pulls = " ".join(f"{m}:{n}" for m, n in detail[e]["iterations"].items())
            print(f"bandit_iterations_{e}={pulls}")
        budget = alloc["budget_per_env"]
        print(f"even_split_mean={alloc['even']['mean']:.3f} (budget {budget} iterations per env)")
        print(f"bandit_mean={alloc['bandit']['mean']:.3f}")
    print(f"wall_s={wall:.0f}")
    gain = summary["adaptive"]["mean"] - summary["best_single"]["mean"]
    print(f"adaptive_minus_best_single={gain:+.3f}")


def _merge(counts: list[dict[str, int]]) -> str:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return ",".join(f"{k}:{v}" for k, v in sorted(total.items())) or "none"


if __name__ == "__main__":
    main()
