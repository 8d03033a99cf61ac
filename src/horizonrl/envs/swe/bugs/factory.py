"""The SWE task factory (``horizon tasks build``): real packages in, validated bug instances out.

For each source (a PyPI sdist ``pypi:NAME[==VERSION]`` fetched with pip, or a local directory):

1. snapshot: the sdist (or a tarball of the directory) is stored as ``<out>/packages/<name>.tar.gz``
   and unpacked once (the sandbox template);
2. baseline: the whole suite runs twice in a sandbox with the package's test venv (pytest, the
   package's own dependencies from its PKG-INFO and the test dependencies it declares —
   :mod:`horizonrl.envs.swe.testdeps` — created once, downloaded from PyPI the first time); flaky tests
   and tests that fail at baseline are never used, and a package with no passing test is rejected
   with that reason;
3. candidates: bugs are injected procedurally on the syntax tree of the package's modules
   (:mod:`horizonrl.envs.swe.bugs.mutations`), a seeded sample spread over modules and operators;
4. validation: each candidate runs the suite in a fresh sandbox (timeout: a multiple of the
   baseline time — a bug that hangs the tests is rejected); it is kept only with at least one
   FAIL_TO_PASS and one PASS_TO_PASS test;
5. records: SWE-bench-format instances (the fix as ``patch``; a problem statement naming the failing
   tests and their assertion output, never the fix).

Candidates run in parallel (``workers``), each outcome is appended to ``<out>/build/<package>.jsonl``
as it is known, so an interrupted build resumes where it stopped; the same seed gives the same
instances.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.envs.swe.bugs.mutations import Mutation, sample_mutations
from horizonrl.envs.swe.instances import (
    SWEInstance,
    iter_source_files,
    read_instances,
    unpack_snapshot,
    write_instances,
)
from horizonrl.envs.swe.testbed import (
    TEST_LIMITS,
    TestRun,
    TestVenvError,
    ensure_test_venv,
    run_tests,
    sandbox_binds,
    test_command,
    venv_requirements,
)
from horizonrl.envs.swe.testdeps import package_test_requirements
from horizonrl.errors import DataError
from horizonrl.sandbox.base import SandboxSpec
from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions, prepare_template

PYTHON_PLACEHOLDER = "{python}"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class BuildConfig(BaseModel):
    """What to build (``horizon tasks build`` options)."""

    model_config = ConfigDict(extra="forbid")

    sources: list[str] = Field(description="pypi:NAME[==VERSION] or local package directories.")
    out: Path = Field(description="The dataset directory to write (packages/, instances.jsonl.gz, ...).")
    per_package: int = Field(60, ge=1, description="Validated instances wanted per package.")
    max_candidates: int = Field(240, ge=1, description="Candidates tried per package at most.")
    seed: int = Field(0, description="Seed of the candidate sample.")
    workers: int = Field(default_factory=lambda: os.cpu_count() or 2, ge=1, description="Parallel sandboxes.")
    timeout_factor: float = Field(5.0, gt=1, description="A candidate's test run may take this x baseline.")
    min_timeout_s: float = Field(20.0, gt=0, description="... and at least this many seconds.")


class CandidateOutcome(BaseModel):
    """One candidate's fate (a line of ``<out>/build/<package>.jsonl``)."""

    index: int
    operator: str
    path: str
    line: int
    accepted: bool
    reason: str = ""
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    messages: dict[str, str] = Field(default_factory=dict)
    seconds: float = 0.0


class PackageReport(BaseModel):
    name: str
    version: str
    accepted: int = 0
    tried: int = 0
    rejected: dict[str, int] = Field(default_factory=dict)
    baseline_tests: int = 0
    baseline_s: float = 0.0
    error: str | None = None


# --- sources ------------------------------------------------------------------------------------


def _fetch_pypi(spec: str, packages: Path) -> Path:
    """Download the sdist of ``spec`` (``name`` or ``name==version``) into ``packages``."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                spec,
                "-d",
                tmp,
            ],
            capture_output=True,
            text=True,
        )
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode or not archives:
            raise DataError(f"could not fetch an sdist of {spec!r} from PyPI: {done.stderr.strip()[-300:]}")
        target = packages / archives[0].name
        packages.mkdir(parents=True, exist_ok=True)
        archives[0].replace(target)
    return target


def _pack_directory(root: Path, packages: Path) -> Path:
    """A reproducible tarball of a local package directory (no .git, no caches)."""
    if not root.is_dir():
        raise DataError(f"package source {str(root)!r} is not a directory (or pypi:NAME)")
    name = _SAFE.sub("-", root.resolve().name)
    target = packages / f"{name}.tar.gz"
    packages.mkdir(parents=True, exist_ok=True)
    skip = {".git", "__pycache__", ".pytest_cache", ".tox", ".venv", "build", "dist"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if any(part in skip or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
                continue
            info = tar.gettarinfo(str(path), arcname=f"{name}/{rel}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    target.write_bytes(buffer.getvalue())
    return target


def fetch_source(source: str, packages: Path) -> Path:
    """The snapshot archive of ``source`` under ``packages`` (fetched or packed once)."""
    if source.startswith("pypi:"):
        spec = source.removeprefix("pypi:")
        existing = sorted(packages.glob(f"{_SAFE.sub('_', spec.split('==')[0]).lower()}-*.tar.gz"))
        existing += sorted(packages.glob(f"{spec.split('==')[0]}-*.tar.gz"))
        version = spec.split("==")[1] if "==" in spec else None
        for archive in existing:
            if version is None or archive.name.endswith(f"-{version}.tar.gz"):
                return archive
        return _fetch_pypi(spec, packages)
    return _pack_directory(Path(source), packages)


def package_version(snapshot: Path) -> str:
    info = snapshot / "PKG-INFO"
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "0"


# --- patches and statements ---------------------------------------------------------------------


def fix_patch(mutation: Mutation) -> str:
    """A git-style diff that turns the mutated module back into the original (the fix)."""
    lines = difflib.unified_diff(
        mutation.mutated.splitlines(keepends=True),
        mutation.original.splitlines(keepends=True),
        f"a/{mutation.path}",
        f"b/{mutation.path}",
        n=3,
    )
    body = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    return f"diff --git a/{mutation.path} b/{mutation.path}\n{body}"


def problem_statement(repo: str, failing: list[str], messages: dict[str, str], limit: int = 12) -> str:
    """The symptom: which tests fail and how (never where or what the fix is)."""
    lines = [
        f"After a recent change, some tests of `{repo}` fail. Find the cause in the package's source "
        "and fix it so that these tests pass again without breaking any other test. Do not change "
        "the tests.",
        "",
        "Failing tests:",
    ]
    for test in failing[:limit]:
        message = messages.get(test, "").strip()
        lines.append(f"- {test}" + (f"\n    {message[:300]}" if message else ""))
    if len(failing) > limit:
        lines.append(f"- ... and {len(failing) - limit} more")
    return "\n".join(lines)


# --- the build ----------------------------------------------------------------------------------


class _Package:
    """One package's build: its snapshot, baseline and candidates."""

    def __init__(
        self, config: BuildConfig, archive: Path, backend: BwrapBackend, venv: Path, requirements: list[str]
    ) -> None:
        self.config, self.archive, self.backend, self.venv = config, archive, backend, venv
        self.requirements = requirements
        self.snapshot = unpack_snapshot(archive)
        self.name = archive.name.removesuffix(".tar.gz").rsplit("-", 1)[0]
        self.version = package_version(self.snapshot)
        self.command = test_command(venv, self.snapshot)
        self.log = config.out / "build" / f"{archive.name.removesuffix('.tar.gz')}.jsonl"
        self.report = PackageReport(name=self.name, version=self.version)

    async def _run(self, files: dict[str, str], timeout: float) -> TestRun:
        async with await self.backend.create(
            SandboxSpec(template=str(self.snapshot), limits=TEST_LIMITS)
        ) as box:
            for path, text in files.items():
                await box.write_file(path, text.encode())
            return await run_tests(box, self.command, timeout=timeout)

    async def baseline(self) -> TestRun:
        """The suite on the clean snapshot, run twice: a test whose outcome differs between the runs
        is flaky and never becomes a FAIL_TO_PASS or PASS_TO_PASS test."""
        run = await self._run({}, timeout=600)
        again = await self._run({}, timeout=600)
        for test in list(run.statuses):
            if run.passed(test) != again.passed(test):
                run.statuses[test] = "FLAKY"
        self.report.baseline_tests, self.report.baseline_s = len(run.passing), run.duration
        if not run.passing:
            tail = run.output.strip()[-400:]
            raise DataError(f"{self.name}: no test passes at baseline (exit {run.exit_code}): {tail}")
        return run

    def candidates(self) -> list[Mutation]:
        modules = list(iter_source_files(self.snapshot))
        if not modules:
            raise DataError(f"{self.name}: no source modules found in {self.snapshot}")
        per_module = max(4, self.config.max_candidates // len(modules) + 1)
        found: list[Mutation] = []
        for module in modules:
            rel = str(module.relative_to(self.snapshot))
            try:
                source = module.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            seed = int(hashlib.sha256(f"{self.config.seed}:{rel}".encode()).hexdigest()[:8], 16)
            found += sample_mutations(source, rel, per_module, seed)
        order = sorted(
            range(len(found)),
            key=lambda i: hashlib.sha256(f"{self.config.seed}:{i}:{found[i].path}".encode()).hexdigest(),
        )
        return [found[i] for i in order[: self.config.max_candidates]]

    def done(self) -> dict[int, CandidateOutcome]:
        if not self.log.exists():
            return {}
        outcomes = {}
        for line in self.log.read_text().splitlines():
            try:
                outcome = CandidateOutcome.model_validate_json(line)
            except ValueError:
                continue  # a line cut by a crash: that candidate runs again
            outcomes[outcome.index] = outcome
        return outcomes

    async def validate(
        self, index: int, mutation: Mutation, base: TestRun, timeout: float
    ) -> CandidateOutcome:
        start = time.perf_counter()
        outcome = CandidateOutcome(
            index=index, operator=mutation.operator, path=mutation.path, line=mutation.line, accepted=False
        )
        try:
            run = await self._run({mutation.path: mutation.mutated}, timeout=timeout)
        except Exception as exc:  # a sandbox failure rejects this candidate, not the build
            outcome.reason = f"error: {type(exc).__name__}: {exc}"[:300]
            return outcome
        outcome.seconds = time.perf_counter() - start
        if run.timed_out:
            outcome.reason = "timeout"
            return outcome
        passing = base.passing
        f2p = sorted(t for t in passing if not run.passed(t))
        p2p = sorted(t for t in passing if run.passed(t))
        if not f2p:
            outcome.reason = "no failing test"
        elif not p2p:
            outcome.reason = "no passing test (the bug breaks the whole suite)"
        elif not any(t in run.statuses for t in f2p):
            outcome.reason = "tests not collected (import error)"
        else:
            outcome.accepted = True
            outcome.fail_to_pass, outcome.pass_to_pass = f2p, p2p
            outcome.messages = {t: run.messages.get(t, "") for t in f2p[:12]}
        return outcome

    async def build(self, on_outcome: Callable[[CandidateOutcome], None]) -> list[SWEInstance]:
        base = await self.baseline()
        timeout = max(self.config.min_timeout_s, self.config.timeout_factor * base.duration)
        candidates = self.candidates()
        outcomes = self.done()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        limit = asyncio.Semaphore(self.config.workers)

        def accepted() -> int:
            return sum(o.accepted for o in outcomes.values())

        async def one(index: int, mutation: Mutation) -> None:
            async with limit:
                if index in outcomes or accepted() >= self.config.per_package:
                    return
                outcome = await self.validate(index, mutation, base, timeout)
                outcomes[index] = outcome
                with self.log.open("a") as handle:
                    handle.write(outcome.model_dump_json() + "\n")
                on_outcome(outcome)

        await asyncio.gather(*(one(i, m) for i, m in enumerate(candidates)))
        template = await asyncio.to_thread(
            prepare_template, str(self.snapshot), Path(self.backend.options.cache_dir)
        )
        instances = []
        kept = sorted(i for i, o in outcomes.items() if o.accepted)[: self.config.per_package]
        for index in kept:
            outcome, mutation = outcomes[index], candidates[index]
            instances.append(self._instance(index, mutation, outcome, template.base))
        self.report.accepted, self.report.tried = len(instances), len(outcomes)
        self.report.rejected = dict(Counter(o.reason for o in outcomes.values() if not o.accepted))
        return instances

    def _instance(self, index: int, mutation: Mutation, outcome: CandidateOutcome, base: str) -> SWEInstance:
        python = f"{PYTHON_PLACEHOLDER} -m pytest"
        command = self.command.replace(f"{self.venv}/bin/python -m pytest", python)
        return SWEInstance(
            instance_id=f"{self.name}__{self.version}-{index:04d}",
            repo=self.name,
            base_commit=base,
            patch=fix_patch(mutation),
            problem_statement=problem_statement(self.name, outcome.fail_to_pass, outcome.messages),
            FAIL_TO_PASS=outcome.fail_to_pass,
            PASS_TO_PASS=outcome.pass_to_pass,
            version=self.version,
            created_at="2026-11-23T00:00:00Z",
            snapshot=self.archive.name,
            test_command=command,
            requirements=self.requirements,
            bug={
                "operator": mutation.operator,
                "path": mutation.path,
                "line": mutation.line,
                "function": mutation.function,
                "description": mutation.description,
                "validation_s": round(outcome.seconds, 3),
            },
        )


async def build_dataset(
    config: BuildConfig, on_outcome: Callable[[str, CandidateOutcome], None] | None = None
) -> list[PackageReport]:
    """Build (or resume) the dataset of ``config`` (see the module doc); returns a report per package."""
    packages_dir = config.out / "packages"
    reports, instances = [], []
    for source in config.sources:
        backend = None
        try:
            archive = fetch_source(source, packages_dir)
            extra = package_test_requirements(unpack_snapshot(archive))
            venv = await asyncio.to_thread(ensure_test_venv, venv_requirements(extra), True)
            options = BwrapOptions(
                ro_binds=sandbox_binds(venv),
                max_sandboxes=max(64, config.workers * 2),
            )
            backend = BwrapBackend(options)
            package = _Package(config, archive, backend, venv, extra)
            built = await package.build(lambda o, name=package.name: on_outcome and on_outcome(name, o))
            instances += built
            reports.append(package.report)
        except (DataError, TestVenvError) as exc:  # one bad package is a recorded rejection, not a crash
            reports.append(PackageReport(name=source, version="", error=str(exc)))
        finally:
            if backend is not None:
                await backend.aclose()
    existing = _existing_instances(config.out, {i.instance_id for i in instances}, {r.name for r in reports})
    write_instances(
        config.out / "instances.jsonl.gz", sorted(existing + instances, key=lambda i: i.instance_id)
    )
    (config.out / "build").mkdir(parents=True, exist_ok=True)
    (config.out / "build" / "report.json").write_text(json.dumps([r.model_dump() for r in reports], indent=2))
    return reports


def _existing_instances(out: Path, new_ids: set[str], rebuilt: set[str]) -> list[SWEInstance]:
    """Instances of packages this build did not touch (building one package keeps the others)."""
    path = out / "instances.jsonl.gz"
    if not path.exists():
        return []
    return [i for i in read_instances(path) if i.instance_id not in new_ids and i.repo not in rebuilt]


def datasheet(out: Path, splits: dict[str, list[str]]) -> str:
    """Counts per package and bug type, validation and test times, for ``<out>/datasheet.md``."""
    instances = read_instances(out / "instances.jsonl.gz")
    reports = {r["name"]: r for r in json.loads((out / "build" / "report.json").read_text())}
    lines = [
        "# SWE dataset datasheet",
        "",
        "| package | version | split | instances | tried | yield | suite tests | median validation s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    split_of = {p: s for s, ps in splits.items() for p in ps}
    by_repo: dict[str, list[SWEInstance]] = {}
    for inst in instances:
        by_repo.setdefault(inst.repo, []).append(inst)
    for repo, items in sorted(by_repo.items()):
        report: dict[str, Any] = reports.get(repo, {})
        tried = report.get("tried") or 0
        times = [float(i.bug.get("validation_s", 0)) for i in items]  # type: ignore[arg-type]
        lines.append(
            f"| {repo} | {items[0].version} | {split_of.get(repo, '-')} | {len(items)} | {tried} | "
            f"{len(items) / tried:.0%} | {report.get('baseline_tests', '-')} | {median(times):.2f} |"
            if tried
            else f"| {repo} | {items[0].version} | {split_of.get(repo, '-')} | {len(items)} | - | - | - | - |"
        )
    operators = Counter(str(i.bug.get("operator")) for i in instances)
    lines += ["", "| bug type | instances |", "|---|---|"]
    lines += [f"| {op} | {n} |" for op, n in sorted(operators.items())]
    f2p = [len(i.FAIL_TO_PASS) for i in instances]
    lines += [
        "",
        f"Total: {len(instances)} instances from {len(by_repo)} packages; "
        f"median FAIL_TO_PASS tests per instance: {median(f2p) if f2p else 0}.",
    ]
    return "\n".join(lines) + "\n"
