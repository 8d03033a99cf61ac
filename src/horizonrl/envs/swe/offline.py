"""Prepare this machine so that SWE episodes, ``horizon swe eval`` and the task factory on a dataset's
own packages need no network (``make setup`` runs it for the shipped dataset)::

    python -m horizonrl.envs.swe.offline [DATASET] [--no-factory]

It unpacks the dataset's package snapshots and creates, once, every test venv they need: one per
set of requirements among the instances (what evaluation and episodes use), and — unless
``--no-factory`` — the venv the task factory would create for each package sdist of the dataset
(its dependencies and declared test dependencies). A second run finds everything ready and only
checks (about a second). Building tasks from ``pypi:`` sources, or from packages whose test venv was
never created here, still downloads from PyPI.

It then validates the dataset in *this* environment, once per interpreter: each snapshot's suite runs
unpatched in a sandbox, as the evaluator runs it (the gold patch restores that state), and the test ids
that fail there are recorded (``env-validation.json`` next to the test venvs, keyed by the interpreter's
version and path, then by snapshot). Evaluation leaves those out of the instances' checks — a dataset
built with a Python that has tkinter lists six's tkinter tests as PASS_TO_PASS, which fail with one
that has not. A line per snapshot with such tests says how many and which.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from horizonrl.envs.swe.evaluate import SWERuntime
from horizonrl.envs.swe.instances import Dataset, SWEInstance, unpack_snapshot
from horizonrl.envs.swe.testbed import (
    TestVenvError,
    ensure_test_venv,
    environment_fingerprint,
    load_env_record,
    one_line,
    save_env_record,
    venv_requirements,
)
from horizonrl.envs.swe.testdeps import package_test_requirements
from horizonrl.errors import DataError, HorizonError


def instance_requirement_sets(dataset: Dataset) -> set[tuple[str, ...]]:
    """The test venvs the dataset's instances run with."""
    return {venv_requirements(i.requirements) for i in dataset.instances.values()}


def factory_requirement_sets(dataset: Dataset) -> set[tuple[str, ...]]:
    """The test venvs the task factory would create for the dataset's package sdists."""
    archives = sorted((dataset.root / "packages").glob("*.tar.gz"))
    return {venv_requirements(package_test_requirements(unpack_snapshot(a))) for a in archives}


@dataclass
class Validation:
    """One snapshot (with its venv, test command and test_patch) run unpatched in this environment."""

    key: str
    snapshot: str
    tests: list[str] = field(default_factory=list)  # the dataset's test ids of the snapshot
    failing: list[str] = field(default_factory=list)  # those failing here, unpatched
    seconds: float = 0.0
    cached: bool = False
    error: str | None = None

    def line(self) -> str | None:
        """The one-line summary, for a snapshot with tests that cannot pass here (or that failed)."""
        name = self.snapshot.removesuffix(".tar.gz")
        if self.error:
            return f"{name}: could not validate the environment ({self.error}); every test counts"
        if not self.failing:
            return None
        return (
            f"{name}: {len(self.failing)} of {len(self.tests)} tests cannot pass with this interpreter "
            f"(e.g. {self.failing[0]}); they are left out of its instances' checks"
        )


def validate_environment(
    dataset: Dataset, workers: int | None = None, timeout: float = 600.0
) -> list[Validation]:
    """Run each snapshot's suite of ``dataset`` once, unpatched, unless this environment's record has
    it; record the tests that fail (all of them, the dataset's among them). Returns one Validation per
    snapshot, ``failing`` cut to the dataset's test ids."""
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    return asyncio.run(_validate(dataset, workers, timeout))


async def _validate(dataset: Dataset, workers: int, timeout: float) -> list[Validation]:
    runtime = SWERuntime(dataset)
    units: dict[str, list[SWEInstance]] = {}
    for instance in sorted(dataset.instances.values(), key=lambda i: i.instance_id):
        units.setdefault(runtime.validation_key(instance), []).append(instance)
    record = load_env_record()
    limit = asyncio.Semaphore(workers)

    async def one(key: str, instances: list[SWEInstance]) -> Validation:
        tests = sorted({t for i in instances for t in (*i.FAIL_TO_PASS, *i.PASS_TO_PASS)})
        done = Validation(key, instances[0].snapshot, tests)
        entry = record.get(key)
        if isinstance(entry, dict):
            recorded = set(entry.get("failing", []))  # type: ignore[arg-type]
            done.failing, done.cached = [t for t in tests if t in recorded], True
            return done
        async with limit:
            start = time.perf_counter()
            try:
                run = await runtime.run_original(instances[0], timeout=timeout)
            except (HorizonError, OSError) as exc:
                done.error = f"{type(exc).__name__}: {exc}"
                return done
            done.seconds = time.perf_counter() - start
        if run.timed_out:
            done.error = f"the unpatched suite timed out after {timeout:.0f} s"
            return done
        if not run.passing:  # the sandbox or the venv is broken, not the tests: record nothing
            done.error = f"no test passed unpatched (exit {run.exit_code}): {one_line(run.output[-2000:])}"
            return done
        failing = (set(tests) | set(run.statuses)) - run.passing
        done.failing = [t for t in tests if t in failing]
        save_env_record(
            {
                key: {
                    "snapshot": done.snapshot.removesuffix(".tar.gz"),
                    "failing": sorted(failing),
                    "passed": len(run.passing),
                    "seconds": round(done.seconds, 2),
                }
            }
        )
        return done

    try:
        return list(await asyncio.gather(*(one(k, v) for k, v in units.items())))
    finally:
        await runtime.aclose()


def prepare(
    root: Path | None = None,
    factory: bool = True,
    validate: bool = True,
    say: Callable[[str], None] | None = print,
) -> list[Path]:
    """Unpack the snapshots and create the test venvs of the dataset at ``root`` (default: the
    shipped one), then (``validate``) validate it in this environment, ``say``-ing a line per snapshot
    with tests that cannot pass here; returns the venvs. Downloads only what is not there yet."""
    dataset = Dataset(root) if root else Dataset.shipped()
    for snapshot in sorted({i.snapshot for i in dataset.instances.values()}):
        unpack_snapshot(dataset.root / "packages" / snapshot)
    wanted = instance_requirement_sets(dataset)
    if factory:
        wanted |= factory_requirement_sets(dataset)
    venvs = [ensure_test_venv(requirements, download=True) for requirements in sorted(wanted)]
    if validate:
        start = time.perf_counter()
        validations = validate_environment(dataset)
        lines = [line for v in validations if (line := v.line())]
        ran = [v for v in validations if not v.cached and not v.error]
        if say is not None:
            for line in lines:
                say(line)
            if ran:
                say(
                    f"SWE offline: validated {len(ran)} snapshots with {environment_fingerprint()} "
                    f"in {time.perf_counter() - start:.1f} s"
                )
    return venvs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horizonrl.envs.swe.offline", description=__doc__)
    parser.add_argument("dataset", nargs="?", type=Path, help="SWE dataset directory (default: shipped)")
    parser.add_argument("--no-factory", action="store_true", help="only what evaluation and episodes need")
    args = parser.parse_args(argv)
    try:
        venvs = prepare(args.dataset, factory=not args.no_factory)
    except (TestVenvError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = venvs[0].parent if venvs else "-"
    print(f"SWE offline: {len(venvs)} test venvs ready under {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
