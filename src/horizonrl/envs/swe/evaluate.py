"""Outcome reward of a SWE instance: apply a patch to a clean copy of the buggy repository and run
the instance's FAIL_TO_PASS and PASS_TO_PASS tests in a sandbox.

A patch is applied with SWE-bench's fallbacks (``git apply``, then ``--3way``, then ``patch
--fuzz``); changes it makes to test files (new ones included) are undone, then the instance's
``test_patch`` is applied, before the tests run, so a patch cannot pass by editing the tests.
``resolved`` means every FAIL_TO_PASS and PASS_TO_PASS test passes; ``partial`` that some
FAIL_TO_PASS test passes but not all of them (or a PASS_TO_PASS test broke); ``apply_failed`` that
no strategy applied the patch (``error`` says why git apply refused it, on one line).

Tests that cannot pass in *this* environment are left out of the checks: ``make setup``
(:mod:`horizonrl.envs.swe.offline`) runs each snapshot's suite once, unpatched, with this interpreter
and records the dataset's test ids that fail there (six's ``test_move_items[tkinter]`` on a Python
built without tkinter) — the gold patch restores that very state, so no patch can pass them here.
The report lists them (``env_excluded``). With no record for this interpreter, every test counts, as
in the dataset, and stderr says once that ``make setup`` validates the environment.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from horizonrl.envs.swe.instances import Dataset, SWEInstance
from horizonrl.envs.swe.testbed import (
    TEST_LIMITS,
    TestRun,
    apply_patch,
    commit_state,
    ensure_test_venv,
    environment_fingerprint,
    load_env_record,
    one_line,
    run_tests,
    sandbox_binds,
    test_command,
    venv_requirements,
)
from horizonrl.errors import HorizonError
from horizonrl.sandbox.base import Sandbox, SandboxLimits, SandboxSpec
from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions

Status = Literal["resolved", "partial", "unresolved", "apply_failed", "error"]
_TEST_FILE = re.compile(r"(^|/)(tests?/|testing/|test_[^/]*\.py$|[^/]*_test\.py$|conftest\.py$)")


class EvalReport(BaseModel):
    """What happened to one patch of one instance."""

    instance_id: str
    status: Status
    apply: str | None = Field(None, description="The strategy that applied the patch (None: none did).")
    fail_to_pass: dict[str, bool] = Field(default_factory=dict)
    pass_to_pass_failed: list[str] = Field(default_factory=list)
    pass_to_pass_total: int = 0
    env_excluded: list[str] = Field(
        default_factory=list, description="The instance's tests left out: they fail in this environment."
    )
    seconds: float = 0.0
    error: str | None = None
    log: str = ""

    @property
    def reward(self) -> float:
        return 1.0 if self.status == "resolved" else 0.0

    def metrics(self) -> dict[str, float]:
        """Numbers for the trajectory record: the apply outcome and per-test results."""
        out = {
            "swe/resolved": float(self.status == "resolved"),
            "swe/applied": float(self.apply is not None),
            "swe/fail_to_pass_passed": float(sum(self.fail_to_pass.values())),
            "swe/fail_to_pass_total": float(len(self.fail_to_pass)),
            "swe/pass_to_pass_failed": float(len(self.pass_to_pass_failed)),
            "swe/env_excluded": float(len(self.env_excluded)),
            "swe/eval_s": self.seconds,
        }
        if self.apply:
            out[f"swe/apply:{self.apply}"] = 1.0
        out.update({f"swe/test:{t}": float(ok) for t, ok in self.fail_to_pass.items()})
        return out


def exclude_env_failures(
    fail_to_pass: list[str], pass_to_pass: list[str], env_failing: Iterable[str]
) -> tuple[list[str], list[str], list[str]]:
    """The FAIL_TO_PASS and PASS_TO_PASS tests that can pass in this environment, and the instance's
    tests left out because they fail here even unpatched (in the instance's order)."""
    failing = set(env_failing)
    excluded = [t for t in [*fail_to_pass, *pass_to_pass] if t in failing]
    kept_f2p = [t for t in fail_to_pass if t not in failing]
    kept_p2p = [t for t in pass_to_pass if t not in failing]
    return kept_f2p, kept_p2p, excluded


_NOTED_UNVALIDATED = False


def note_unvalidated(fingerprint: str) -> None:
    """Say once per process that the environment was not validated (every test counts)."""
    global _NOTED_UNVALIDATED
    if not _NOTED_UNVALIDATED:
        _NOTED_UNVALIDATED = True
        print(
            f"note: SWE tests are not validated with this interpreter ({fingerprint}): every "
            "FAIL_TO_PASS/PASS_TO_PASS test counts, including any that cannot pass here; `make setup` "
            "validates the environment (another dataset: python -m horizonrl.envs.swe.offline DATASET)",
            file=sys.stderr,
        )


class SWERuntime:
    """Sandboxes for SWE instances of one dataset: the buggy starting state and the evaluation."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._backends: dict[Path, BwrapBackend] = {}
        self._venvs: dict[tuple[str, ...], Path] = {}
        self._digests: dict[str, str] = {}
        self._record: dict[str, dict[str, object]] | None = None

    def validation_key(self, instance: SWEInstance) -> str:
        """What a validation entry is for: the snapshot's content, the test venv, the test command
        and the ``test_patch`` (``<snapshot>@<digest>``)."""
        archive = self.dataset.root / "packages" / instance.snapshot
        if instance.snapshot not in self._digests:
            self._digests[instance.snapshot] = hashlib.sha256(archive.read_bytes()).hexdigest()
        parts = [
            self._digests[instance.snapshot],
            *venv_requirements(instance.requirements),
            instance.test_command,
            instance.test_patch,
        ]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
        return f"{instance.snapshot.removesuffix('.tar.gz')}@{digest}"

    def env_failures(self, instance: SWEInstance) -> list[str] | None:
        """The test ids that fail in this environment on the instance's unpatched snapshot (recorded by
        ``make setup``); None when this environment has no record for it."""
        if self._record is None:
            self._record = load_env_record()
        entry = self._record.get(self.validation_key(instance))
        if not isinstance(entry, dict):
            note_unvalidated(environment_fingerprint())
            return None
        return [str(t) for t in entry.get("failing", [])]  # type: ignore[union-attr]

    async def run_original(self, instance: SWEInstance, timeout: float = 600.0) -> TestRun:
        """The whole suite on the instance's *unpatched* snapshot with its ``test_patch``: the state the
        gold patch restores, so a test failing here fails for the environment, not for a patch."""
        snapshot = self.dataset.snapshot_dir(instance)
        box = await self.backend(instance).create(SandboxSpec(template=str(snapshot), limits=TEST_LIMITS))
        try:
            if instance.test_patch.strip():
                await apply_test_patch(box, instance.test_patch)
            return await run_tests(box, self.command(instance), None, timeout=timeout)
        finally:
            await box.close()

    def venv(self, instance: SWEInstance) -> Path:
        """The instance's test venv (prepared by ``make setup``; a missing one is a TestVenvError)."""
        requirements = venv_requirements(instance.requirements)
        if requirements not in self._venvs:
            self._venvs[requirements] = ensure_test_venv(requirements)
        return self._venvs[requirements]

    def check_venvs(self, instances: list[SWEInstance]) -> None:
        """Fail before any sandbox starts if a test venv the instances need is missing."""
        for instance in instances:
            self.venv(instance)

    def backend(self, instance: SWEInstance) -> BwrapBackend:
        venv = self.venv(instance)
        if venv not in self._backends:
            self._backends[venv] = BwrapBackend(BwrapOptions(ro_binds=sandbox_binds(venv)))
        return self._backends[venv]

    async def aclose(self) -> None:
        for backend in self._backends.values():
            await backend.aclose()

    def command(self, instance: SWEInstance) -> str:
        """The instance's test command (default: pytest for the snapshot's layout)."""
        venv = self.venv(instance)
        if not instance.test_command:
            return test_command(venv, self.dataset.snapshot_dir(instance))
        return instance.test_command.replace("{python}", f"{venv}/bin/python")

    async def start(self, instance: SWEInstance, limits: SandboxLimits = TEST_LIMITS) -> tuple[Sandbox, str]:
        """A sandbox holding the instance's buggy repository, committed; returns (sandbox, commit)."""
        snapshot = self.dataset.snapshot_dir(instance)
        box = await self.backend(instance).create(SandboxSpec(template=str(snapshot), limits=limits))
        try:
            await box.write_file(".git/horizonrl-fix.patch", instance.patch.encode())
            result = await box.exec(
                "git apply -R .git/horizonrl-fix.patch && rm .git/horizonrl-fix.patch", timeout=60
            )
            if not result.ok:
                raise HorizonError(f"{instance.instance_id}: the bug does not apply: {result.stderr.strip()}")
            return box, await commit_state(box, f"{instance.instance_id}: buggy state")
        except BaseException:
            await box.close()
            raise

    async def evaluate(self, instance: SWEInstance, patch: str, timeout: float = 600.0) -> EvalReport:
        """Apply ``patch`` to a clean buggy copy and run the instance's tests."""
        start = time.perf_counter()
        report = EvalReport(instance_id=instance.instance_id, status="error")
        try:
            env_failing = self.env_failures(instance)
            box, commit = await self.start(instance)
        except Exception as exc:
            report.error = f"{type(exc).__name__}: {exc}"
            return report
        try:
            strategy, report.log, reason = await apply_patch(box, patch)
            report.apply = strategy
            if strategy is None:
                report.status, report.error = "apply_failed", reason
                return report
            await restore_tests(box, commit)
            if instance.test_patch.strip():
                await apply_test_patch(box, instance.test_patch)
            # the whole suite, as when the instance was validated: a subset in another order can
            # break order-dependent tests (measured: six's test_lazy)
            run = await run_tests(box, self.command(instance), None, timeout=timeout)
            if run.timed_out:
                report.error = f"the tests timed out after {timeout:.0f} s"
                report.status = "unresolved"
                return report
            f2p, p2p, report.env_excluded = exclude_env_failures(
                instance.FAIL_TO_PASS, instance.PASS_TO_PASS, env_failing or ()
            )
            if not f2p:
                report.error = "none of its FAIL_TO_PASS tests can pass in this environment (env_excluded)"
                return report
            report.fail_to_pass = {t: run.passed(t) for t in f2p}
            report.pass_to_pass_failed = [t for t in p2p if not run.passed(t)]
            report.pass_to_pass_total = len(p2p)
            fixed = sum(report.fail_to_pass.values())
            if fixed == len(report.fail_to_pass) and not report.pass_to_pass_failed:
                report.status = "resolved"
            elif fixed:
                report.status = "partial"
            else:
                report.status = "unresolved"
            return report
        except Exception as exc:
            report.error = f"{type(exc).__name__}: {exc}"
            return report
        finally:
            report.seconds = time.perf_counter() - start
            await box.close()


async def restore_tests(box: Sandbox, commit: str) -> None:
    """Undo a patch's changes to test files: edited or deleted ones come back from ``commit``, new
    ones (a conftest.py that skips everything) are removed."""
    await box.exec("git add -A", timeout=120)
    changed = await box.exec(f"git diff --cached --name-status --no-renames {commit}", timeout=60)
    for line in changed.stdout.splitlines():
        status, _, path = line.partition("\t")
        if not _TEST_FILE.search(path):
            continue
        quoted = shlex.quote(path)
        undo = f"git rm -q -f -- {quoted}" if status == "A" else f"git checkout -q {commit} -- {quoted}"
        await box.exec(undo, timeout=60)
    await box.exec("git reset -q", timeout=60)  # the agent's patch stays in the work tree only


async def apply_test_patch(box: Sandbox, test_patch: str) -> None:
    """Apply the instance's ``test_patch`` (SWE-bench: the tests that check the fix)."""
    await box.write_file(".git/horizonrl-test.patch", test_patch.encode())
    result = await box.exec("git apply --verbose .git/horizonrl-test.patch", timeout=120)
    if not result.ok:
        raise HorizonError(f"the instance's test_patch does not apply: {one_line(result.stderr)}")
