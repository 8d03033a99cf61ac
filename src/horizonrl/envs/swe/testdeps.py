"""A package's declared test dependencies, read from its sdist (what its own test suite needs beyond
the package itself), for the task factory's test venv.

Sources, all of them read and merged (duplicates once):

- ``pyproject.toml``: ``[project.optional-dependencies]`` groups named test / tests / testing, and
  PEP 735 ``[dependency-groups]`` of those names (``{include-group = ...}`` followed);
- ``PKG-INFO``: ``Requires-Dist: ...; extra == "test"`` (sdists built by setup.py);
- ``requirements-test*.txt``, ``requirements_test*.txt``, ``test-requirements*.txt`` and
  ``requirements/test*.txt`` (``-r`` includes followed, options skipped);
- ``tox.ini`` ``[testenv]``: ``deps`` (unconditional lines), and the ``extras`` and
  ``dependency_groups`` it names.

The functions over parsed text are pure (no I/O); :func:`declared_test_requirements` reads the files.
"""

from __future__ import annotations

import configparser
import re
import tomllib
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from horizonrl.envs.swe.testbed import package_requirements

TEST_GROUPS = frozenset({"test", "tests", "testing"})
_REQUIREMENT_FILES = (
    "requirements-test*.txt",
    "requirements_test*.txt",
    "test-requirements*.txt",
    "test_requirements*.txt",
    "requirements/test*.txt",
)
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def normalize(name: str) -> str:
    """A group, extra or project name as PEP 685 / PEP 503 compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_lines(lines: list[str]) -> list[str]:
    """Requirement strings of a list of lines: comments, options (``-r``, ``-e``, ``--hash``) and
    local paths dropped."""
    out = []
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-", ".", "/", "{")):
            continue
        out.append(line)
    return out


def from_optional_dependencies(project: dict[str, Any], groups: AbstractSet[str] = TEST_GROUPS) -> list[str]:
    """The requirements of ``[project.optional-dependencies]`` groups whose names are in ``groups``."""
    extras = project.get("optional-dependencies") or {}
    wanted = {normalize(g) for g in groups}
    return [r for name, reqs in extras.items() if normalize(name) in wanted for r in reqs]


def from_dependency_groups(
    groups_table: dict[str, Any], groups: AbstractSet[str] = TEST_GROUPS, _seen: frozenset[str] = frozenset()
) -> list[str]:
    """The requirements of PEP 735 dependency groups named in ``groups``, includes followed."""
    wanted = {normalize(g) for g in groups}
    out: list[str] = []
    for name, entries in groups_table.items():
        key = normalize(name)
        if key not in wanted or key in _seen:
            continue
        for entry in entries:
            if isinstance(entry, str):
                out.append(entry)
            elif isinstance(entry, dict) and "include-group" in entry:
                out += from_dependency_groups(groups_table, {entry["include-group"]}, _seen | {key})
    return out


def from_pyproject(
    data: dict[str, Any], extras: AbstractSet[str] = frozenset(), groups: AbstractSet[str] = frozenset()
) -> list[str]:
    """Test requirements of a parsed pyproject.toml: test-named extras and dependency groups, plus
    the ``extras`` and ``groups`` named elsewhere (e.g. by tox)."""
    project = data.get("project") or {}
    out = from_optional_dependencies(project, TEST_GROUPS | extras)
    out += from_dependency_groups(data.get("dependency-groups") or {}, TEST_GROUPS | groups)
    self_name = normalize(str(project.get("name", "")))
    return [
        r for r in out if not self_name or normalize(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) != self_name
    ]


def from_pkg_info(text: str, extras: AbstractSet[str] = TEST_GROUPS) -> list[str]:
    """``Requires-Dist`` lines of PKG-INFO that belong to a test extra (marker ``extra == ...``)."""
    wanted = {normalize(e) for e in extras}
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec = line.split(":", 1)[1].strip()
        match = _EXTRA.search(spec)
        if match and normalize(match.group(1)) in wanted:
            requirement, _, marker = spec.partition(";")
            rest = _EXTRA.sub("", marker).strip()
            rest = re.sub(r"^(and|or)\s+|\s+(and|or)$", "", rest.strip()).strip()
            out.append(requirement.strip() + (f"; {rest}" if rest else ""))
    return out


def from_tox_ini(text: str) -> tuple[list[str], set[str], set[str]]:
    """(deps, extras, dependency groups) of tox.ini's ``[testenv]``; factor-conditional lines
    (``py311: x``) and substitutions are skipped."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return [], set(), set()
    if not parser.has_section("testenv"):
        return [], set(), set()
    section = parser["testenv"]

    def values(key: str) -> list[str]:
        lines = re.split(r"[\n,]", section.get(key, ""))
        return [v.strip() for v in lines if v.strip() and not re.match(r"^[\w{}.,-]+:\s", v.strip())]

    deps = _requirement_lines(section.get("deps", "").splitlines())
    deps = [d for d in deps if not re.match(r"^[\w{}.,!-]+:\s", d) and "{" not in d]
    return deps, set(values("extras")), set(values("dependency_groups"))


def _read_requirements_file(path: Path, seen: set[Path]) -> list[str]:
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    lines = path.read_text(errors="replace").splitlines()
    out = _requirement_lines(lines)
    for line in lines:
        match = re.match(r"^\s*(?:-r|--requirement)[\s=]*(\S+)", line)
        if match:
            out += _read_requirements_file(path.parent / match.group(1), seen)
    return out


def declared_test_requirements(root: Path) -> list[str]:
    """Every test requirement the unpacked sdist at ``root`` declares (see the module doc), sorted."""
    found: list[str] = []
    deps, tox_extras, tox_groups = [], set(), set()
    if (root / "tox.ini").is_file():
        deps, tox_extras, tox_groups = from_tox_ini((root / "tox.ini").read_text(errors="replace"))
        found += deps
    if (root / "pyproject.toml").is_file():
        try:
            data = tomllib.loads((root / "pyproject.toml").read_text(errors="replace"))
        except tomllib.TOMLDecodeError:
            data = {}
        found += from_pyproject(data, tox_extras, tox_groups)
    if (root / "PKG-INFO").is_file():
        found += from_pkg_info((root / "PKG-INFO").read_text(errors="replace"), TEST_GROUPS | tox_extras)
    seen: set[Path] = set()
    for pattern in _REQUIREMENT_FILES:
        for path in sorted(root.glob(pattern)):
            found += _read_requirements_file(path, seen)
    return sorted({" ".join(r.split()) for r in found})


def package_test_requirements(root: Path) -> list[str]:
    """What the package's test venv holds beyond pytest: its runtime dependencies (PKG-INFO) and its
    declared test dependencies."""
    return sorted(set(package_requirements(root)) | set(declared_test_requirements(root)))
