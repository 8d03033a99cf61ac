"""SWE task instances in SWE-bench's format, the package snapshots they refer to, and the datasets.

A dataset directory holds one source snapshot per package and the instances as JSONL::

    <dataset>/packages/<name>-<version>.tar.gz   the package's sdist, as fetched (the source snapshot)
    <dataset>/instances.jsonl[.gz]               one SWEInstance per line
    <dataset>/splits.json                        {"train": [package, ...], "test": [...]}  (optional)
    <dataset>/datasheet.md                       counts per package and bug type, test times

An instance's repository at ``base_commit`` is the snapshot; the bug is the *reverse* of ``patch``
(the fix), which SWE-smith-style factories inject. Snapshots are unpacked once into a cache
directory (``$HORIZONRL_CACHE`` or ``~/.cache/horizonrl``) and used read-only as sandbox templates.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from horizonrl.errors import DataError

SHIPPED_DATASET = Path(__file__).with_name("data")


def cache_root() -> Path:
    return Path(os.environ.get("HORIZONRL_CACHE", Path.home() / ".cache" / "horizonrl"))


class SWEInstance(BaseModel):
    """One task instance: SWE-bench's fields (a SWE-bench record loads as it is, its extra fields
    kept), plus what the environment needs — derived from SWE-bench's fields when absent."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    repo: str = Field(description="The package, e.g. 'inflection' (SWE-bench: 'owner/name').")
    base_commit: str = Field(description="The snapshot's commit in the workspace repository.")
    patch: str = Field(description="The fix: a git diff from the buggy state to the snapshot.")
    test_patch: str = Field("", description="Changes to the tests, applied before the tests run.")
    problem_statement: str
    hints_text: str = ""
    created_at: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    FAIL_TO_PASS: list[str] = Field(description="A list, or SWE-bench's JSON-encoded list.")
    PASS_TO_PASS: list[str] = Field(description="A list, or SWE-bench's JSON-encoded list.")
    # horizonrl extensions
    snapshot: str = Field(
        "",
        description="The snapshot's file name under <dataset>/packages (default: <repo>-<version>.tar.gz).",
    )
    test_command: str = Field(
        "",
        description="Runs the tests ({python}: the test venv's python; default: pytest for the layout).",
    )
    requirements: list[str] = Field(
        default_factory=list, description="The package's test venv beyond pytest (default: the shared one)."
    )
    bug: dict[str, object] = Field(default_factory=dict, description="How the bug was made (datasheet).")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_test_list(cls, value: object) -> object:
        """SWE-bench stores these as JSON-encoded strings: '["tests/test_x.py::test_y"]'."""
        if not isinstance(value, str):
            return value
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"a JSON-encoded list of test ids, or a list; got {value[:60]!r}") from None
        if not isinstance(decoded, list):
            raise ValueError(f"a JSON-encoded list of test ids, or a list; got {value[:60]!r}")
        return decoded

    @model_validator(mode="after")
    def _derive_snapshot(self) -> SWEInstance:
        if not self.snapshot:
            self.snapshot = f"{self.repo.split('/')[-1]}-{self.version}.tar.gz"
        return self


def read_instances(path: Path) -> list[SWEInstance]:
    """Instances from a JSONL(.gz) file; a bad line is an error naming the file and line."""
    if not path.exists():
        raise DataError(f"no instance file {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    instances = []
    with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                instances.append(SWEInstance.model_validate_json(line))
            except ValidationError as exc:
                raise DataError(f"{path}:{number}: not a valid SWE instance: {_one_line(exc)}") from None
    return instances


def _one_line(exc: ValidationError) -> str:
    """Each wrong field and what it must be, on one line."""
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'line'}: {e['msg']}" for e in exc.errors()]
    return "; ".join(parts)


def write_instances(path: Path, instances: list[SWEInstance]) -> None:
    """Write atomically (a crash leaves the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    tmp = path.with_name(path.name + ".tmp")
    with opener(tmp, "wt", encoding="utf-8") as handle:  # type: ignore[operator]
        for instance in instances:
            handle.write(instance.model_dump_json() + "\n")
    tmp.replace(path)


class Dataset:
    """A dataset directory (see the module doc); ``Dataset.shipped()`` is the one in the package."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        files = [self.root / "instances.jsonl.gz", self.root / "instances.jsonl"]
        found = next((f for f in files if f.exists()), None)
        if found is None:
            raise DataError(f"{self.root} is not a SWE dataset: no instances.jsonl(.gz) in it")
        self.instances = {i.instance_id: i for i in read_instances(found)}
        splits_file = self.root / "splits.json"
        self.splits: dict[str, list[str]] = (
            json.loads(splits_file.read_text()) if splits_file.exists() else {}
        )

    @classmethod
    def shipped(cls) -> Dataset:
        return cls(SHIPPED_DATASET)

    def split(self, name: str) -> list[SWEInstance]:
        """The instances of a split (by package); ``all`` is every instance."""
        if name == "all":
            return list(self.instances.values())
        if name not in self.splits:
            valid = ", ".join(["all", *self.splits])
            raise DataError(f"SWE dataset {self.root} has no split {name!r}; valid: {valid}")
        packages = set(self.splits[name])
        return [i for i in self.instances.values() if i.repo in packages]

    def get(self, instance_id: str) -> SWEInstance:
        try:
            return self.instances[instance_id]
        except KeyError:
            raise DataError(f"unknown instance {instance_id!r} in SWE dataset {self.root}") from None

    def snapshot_dir(self, instance: SWEInstance) -> Path:
        return unpack_snapshot(self.root / "packages" / instance.snapshot)


def unpack_snapshot(archive: Path) -> Path:
    """The unpacked source tree of an sdist (cached; unpacked once, atomically)."""
    if not archive.exists():
        raise DataError(f"package snapshot {archive} is missing")
    name = archive.name.removesuffix(".tar.gz")
    target = cache_root() / "swe" / "snapshots" / name
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        with tarfile.open(archive) as tar:
            safe_extract(tar, tmp)
        roots = [p for p in tmp.iterdir()]
        source = roots[0] if len(roots) == 1 and roots[0].is_dir() else tmp
        with contextlib.suppress(OSError):
            source.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not target.is_dir():
        raise DataError(f"could not unpack {archive}")
    return target


def safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract an sdist under ``dest`` and nowhere else: tarfile's ``data`` filter where this Python
    has it (3.11.4+), else the same by hand: absolute or ``..`` paths, links out of the tree and
    devices refused; files owned by whoever unpacks them (not the archive's uids, which root would
    restore), with no setuid bits and no write bits for others."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = dest.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        link = (target.parent / member.linkname).resolve() if member.issym() else None
        if member.islnk():
            link = (root / member.linkname).resolve()
        outside = [p for p in (target, link) if p is not None and not p.is_relative_to(root)]
        if outside or member.isdev() or member.name.startswith("/"):
            raise DataError(
                f"{tar.name}: refusing to unpack {member.name!r} (it would land outside the tree)"
            )
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
        member.mode = (member.mode & 0o755) | (0o700 if member.isdir() else 0o600)
    tar.extractall(dest)  # every member checked above


def iter_source_files(root: Path) -> Iterator[Path]:
    """The package's own modules: .py files outside tests, docs, benchmarks and build scripts."""
    skip_dirs = {
        "tests",
        "test",
        "testing",
        "docs",
        "doc",
        "documentation",
        "benchmarks",
        "benchmark",
        "tools",
    }
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = rel.parts
        if any(p in skip_dirs or p.startswith(".") or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        name = parts[-1]
        if name.startswith("test") or name.endswith("_test.py") or name in {"setup.py", "conftest.py"}:
            continue
        if len(parts) == 1 and name not in {p.name for p in root.glob("*.py")}:
            continue
        yield path
