"""Prepare this machine so that SWE episodes, ``horizon swe eval`` and the task factory on a dataset's
own packages need no network (``make setup`` runs it for the shipped dataset)::

    python -m horizonrl.envs.swe.offline [DATASET] [--no-factory]

It unpacks the dataset's package snapshots and creates, once, every test venv they need: one per
set of requirements among the instances (what evaluation and episodes use), and — unless
``--no-factory`` — the venv the task factory would create for each package sdist of the dataset
(its dependencies and declared test dependencies). A second run finds everything ready and only
checks (about a second). Building tasks from ``pypi:`` sources, or from packages whose test venv was
never created here, still downloads from PyPI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from horizonrl.envs.swe.instances import Dataset, unpack_snapshot
from horizonrl.envs.swe.runtime import TestVenvError, ensure_test_venv, venv_requirements
from horizonrl.errors import DataError


def instance_requirement_sets(dataset: Dataset) -> set[tuple[str, ...]]:
    """The test venvs the dataset's instances run with."""
    return {venv_requirements(i.requirements) for i in dataset.instances.values()}


def factory_requirement_sets(dataset: Dataset) -> set[tuple[str, ...]]:
    """The test venvs the task factory would create for the dataset's package sdists."""
    from horizonrl.tasks.testdeps import package_test_requirements

    archives = sorted((dataset.root / "packages").glob("*.tar.gz"))
    return {venv_requirements(package_test_requirements(unpack_snapshot(a))) for a in archives}


def prepare(root: Path | None = None, factory: bool = True) -> list[Path]:
    """Unpack the snapshots and create the test venvs of the dataset at ``root`` (default: the
    shipped one); returns the venvs. Downloads only what is not there yet."""
    dataset = Dataset(root) if root else Dataset.shipped()
    for snapshot in sorted({i.snapshot for i in dataset.instances.values()}):
        unpack_snapshot(dataset.root / "packages" / snapshot)
    wanted = instance_requirement_sets(dataset)
    if factory:
        wanted |= factory_requirement_sets(dataset)
    return [ensure_test_venv(requirements, download=True) for requirements in sorted(wanted)]


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
