"""The task factory installs a package's declared test dependencies: where they are read from
(pyproject extras and PEP 735 groups, PKG-INFO, requirements files, tox.ini), how they merge with
the test venv's pins, and — with PyPI reachable — that `humanize`, whose tests need freezegun and
pytest>=9, now yields instances."""

from __future__ import annotations

import asyncio
import shutil
import tomllib
from pathlib import Path

import pytest

from horizonrl.envs.swe.testbed import TEST_REQUIREMENTS, venv_requirements
from horizonrl.envs.swe.testdeps import (
    declared_test_requirements,
    from_dependency_groups,
    from_pkg_info,
    from_pyproject,
    from_tox_ini,
)
from horizonrl.errors import DataError

PYPROJECT = """
[project]
name = "Acme.Widgets"
optional-dependencies.tests = ["freezegun", "pytest>=9"]
optional-dependencies.docs = ["sphinx"]
optional-dependencies.Testing = ["hypothesis; python_version >= '3.8'", "acme-widgets[extra]"]

[dependency-groups]
lint = ["ruff"]
test-base = ["pytest-cov"]
test = ["coverage", {include-group = "test-base"}]
"""


def test_pyproject_test_extras_and_groups_are_read_and_other_groups_are_not() -> None:
    got = from_pyproject(tomllib.loads(PYPROJECT))
    # tests / Testing extras (names normalized), the PEP 735 `test` group with its include;
    # docs, lint and the package itself (acme-widgets[extra]) are not test dependencies
    assert sorted(got) == [
        "coverage",
        "freezegun",
        "hypothesis; python_version >= '3.8'",
        "pytest-cov",
        "pytest>=9",
    ]


def test_tox_can_name_the_extras_and_groups_to_install() -> None:
    data = tomllib.loads(PYPROJECT)
    assert "sphinx" in from_pyproject(data, extras={"docs"})
    assert from_dependency_groups(data["dependency-groups"], {"lint"}) == ["ruff"]


def test_tox_ini_deps_extras_and_dependency_groups() -> None:
    deps, extras, groups = from_tox_ini(
        "[tox]\nenv_list = py3\n\n[testenv]\ndeps =\n    pytest>=8\n    coverage[toml]\n"
        "    -rrequirements.txt\n    unidecode: Unidecode>=1.1\n    {[base]deps}\n"
        "extras =\n    tests\ndependency_groups = dev\n\n[testenv:docs]\ndeps = sphinx\n"
    )
    assert deps == ["pytest>=8", "coverage[toml]"]  # no -r, factor-conditional or substituted lines
    assert extras == {"tests"} and groups == {"dev"}
    assert from_tox_ini("[tox]\nenv_list = py3\n") == ([], set(), set())


def test_pkg_info_requires_dist_of_a_test_extra() -> None:
    text = (
        "Metadata-Version: 2.1\nName: x\nRequires-Dist: six\n"
        "Requires-Dist: mock; extra == 'test'\n"
        'Requires-Dist: pytest>=7; python_version >= "3.8" and extra == "testing"\n'
        "Requires-Dist: sphinx; extra == 'docs'\n"
    )
    assert from_pkg_info(text) == ["mock", 'pytest>=7; python_version >= "3.8"']


def test_requirements_files_and_their_includes_are_read(tmp_path: Path) -> None:
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "test.txt").write_text("-r base.txt\npytest-mock  # mocks\n--hash=x\n")
    (tmp_path / "requirements" / "base.txt").write_text("attrs>=22\n-e .\n")
    (tmp_path / "requirements-test-extra.txt").write_text("# nothing but\nresponses\n")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    got = declared_test_requirements(tmp_path)
    assert {"pytest-mock", "attrs>=22", "responses", "freezegun", "coverage"} <= set(got)
    assert "sphinx" not in got and got == sorted(got)


def test_a_declared_requirement_excluding_a_pin_replaces_it_and_a_compatible_one_is_not_repeated() -> None:
    assert venv_requirements(["pytest", "pytest>=8; python_version >= '3.8'"]) == TEST_REQUIREMENTS
    assert venv_requirements(["pytest>=7,<8; python_version < '3.8'"]) == TEST_REQUIREMENTS  # not for us
    merged = venv_requirements(["pytest>=9", "freezegun"])
    assert "pytest>=9" in merged and "pytest==8.4.2" not in merged and "freezegun" in merged


@pytest.mark.slow
def test_humanize_whose_tests_need_declared_test_dependencies_yields_instances(tmp_path: Path) -> None:
    from horizonrl.envs.swe.bugs.factory import BuildConfig, build_dataset, fetch_source

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it")
    try:
        fetch_source("pypi:humanize==4.17.0", tmp_path / "out" / "packages")
    except DataError as exc:
        pytest.skip(f"PyPI is unreachable, so humanize 4.17.0 cannot be fetched: {exc}")
    config = BuildConfig(
        sources=["pypi:humanize==4.17.0"], out=tmp_path / "out", per_package=1, max_candidates=3, workers=2
    )
    report = asyncio.run(build_dataset(config))[0]
    assert report.error is None and report.accepted >= 1, report  # was: "no test passes at baseline"
    assert report.baseline_tests > 500
