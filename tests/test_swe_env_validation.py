"""Environment validation: ``make setup`` runs each snapshot's suite once, unpatched, with this
interpreter and records the tests that fail here; evaluation leaves them out of the instances' checks
(``env_excluded``) so that the gold patch resolves where the dataset's interpreter differed (six's
tkinter tests on a Python without tkinter). Real sandboxes, a hand-written dataset whose snapshot has
a test that cannot pass in any environment here (it imports a module that does not exist)."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import shutil
import tarfile
import time

import pytest

import horizonrl.envs.swe.evaluate as evaluate_module
from horizonrl.envs.swe.bugs.factory import fix_patch
from horizonrl.envs.swe.bugs.mutations import Mutation
from horizonrl.envs.swe.evaluate import SWERuntime, exclude_env_failures
from horizonrl.envs.swe.harness import evaluate_predictions, gold_predictions, summarize
from horizonrl.envs.swe.instances import Dataset, SWEInstance, write_instances
from horizonrl.envs.swe.offline import Validation, prepare, validate_environment
from horizonrl.envs.swe.testbed import TestVenvError as VenvError
from horizonrl.envs.swe.testbed import env_record_path, load_env_record

ORIGINAL = "def double(x):\n    return 2 * x\n"
BUGGY = ORIGINAL.replace("2 * x", "3 * x")
TESTS = """from envcheck import double


def test_double():
    assert double(4) == 8


def test_zero():
    assert double(0) == 0


def test_gui():
    import tkinter_not_here  # passed where the dataset was built; no such module here

    assert tkinter_not_here
"""
T = "tests/test_envcheck.py::"


def test_exclusion_keeps_the_instances_order_and_lists_what_it_left_out() -> None:
    f2p, p2p = ["t::a", "t::gui_1"], ["t::b", "t::gui_2", "t::c"]
    assert exclude_env_failures(f2p, p2p, {"t::gui_1", "t::gui_2", "t::other"}) == (
        ["t::a"],
        ["t::b", "t::c"],
        ["t::gui_1", "t::gui_2"],
    )
    assert exclude_env_failures(f2p, p2p, []) == (f2p, p2p, [])


def test_the_summary_line_names_a_failing_test_and_counts() -> None:
    ok = Validation("k", "six-1.17.0.tar.gz", ["a", "b"])
    assert ok.line() is None
    bad = Validation("k", "six-1.17.0.tar.gz", ["a", "b", "c"], ["b", "c"])
    assert bad.line() == (
        "six-1.17.0: 2 of 3 tests cannot pass with this interpreter (e.g. b); "
        "they are left out of its instances' checks"
    )


def _sdist() -> tuple[str, bytes]:
    """The snapshot, named by its content (the unpacked-snapshot cache is keyed by name)."""
    buffer = io.BytesIO()
    # gzip's header time fixed too: the same bytes every run, so the same record key
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w") as tar,
    ):
        for name, text in {"envcheck/__init__.py": ORIGINAL, "tests/test_envcheck.py": TESTS}.items():
            info = tarfile.TarInfo(f"envcheck/{name}")
            info.size = len(text.encode())
            info.mtime = 0
            tar.addfile(info, io.BytesIO(text.encode()))
    digest = hashlib.sha256((ORIGINAL + TESTS).encode()).hexdigest()[:8]
    return f"envcheck-{digest}.tar.gz", buffer.getvalue()


def _instance(instance_id: str, f2p: list[str], p2p: list[str], snapshot: str) -> SWEInstance:
    return SWEInstance(
        instance_id=instance_id,
        repo="envcheck",
        base_commit="0" * 40,
        patch=fix_patch(Mutation("change_constant", "envcheck/__init__.py", 2, None, ORIGINAL, BUGGY, "")),
        problem_statement="double() is wrong",
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        snapshot=snapshot,
    )


def _forget(dataset: Dataset) -> None:
    """Drop this dataset's entries from the record (as on a machine that never validated it)."""
    path = env_record_path()
    if not path.exists():
        return
    runtime = SWERuntime(dataset)
    keys = {runtime.validation_key(i) for i in dataset.instances.values()}
    data = json.loads(path.read_text())
    for entries in data.values():
        for key in keys:
            entries.pop(key, None)
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it")
    root = tmp_path_factory.mktemp("envcheck") / "dataset"
    (root / "packages").mkdir(parents=True)
    name, data = _sdist()
    (root / "packages" / name).write_bytes(data)
    write_instances(
        root / "instances.jsonl",
        [
            # built where tkinter_not_here existed: test_gui passed there, so it is PASS_TO_PASS
            _instance("envcheck-1", [f"{T}test_double"], [f"{T}test_zero", f"{T}test_gui"], name),
            # and a FAIL_TO_PASS test that cannot pass here at all
            _instance("envcheck-2", [f"{T}test_gui"], [f"{T}test_zero"], name),
        ],
    )
    dataset = Dataset(root)
    _forget(dataset)
    return dataset


def test_setup_records_what_fails_here_and_gold_resolves_without_it(
    dataset: Dataset, capsys: pytest.CaptureFixture[str]
) -> None:
    # no record yet: every test counts, as in the dataset, and stderr says so once
    evaluate_module._NOTED_UNVALIDATED = False
    try:
        before = asyncio.run(evaluate_predictions(dataset, gold_predictions(dataset), workers=2))
    except VenvError as exc:
        pytest.skip(f"the SWE test venv is not prepared (run `make setup`): {exc}")
    assert [r.status for r in before] == ["partial", "unresolved"], [r.error for r in before]
    assert before[0].pass_to_pass_failed == [f"{T}test_gui"] and not before[0].env_excluded
    assert capsys.readouterr().err.count("`make setup` validates the environment") == 1

    lines: list[str] = []
    start = time.perf_counter()
    prepare(dataset.root, factory=False, say=lines.append)  # what `make setup` runs
    seconds = time.perf_counter() - start
    snapshot = next(iter(dataset.instances.values())).snapshot.removesuffix(".tar.gz")
    assert lines[0] == (
        f"{snapshot}: 1 of 3 tests cannot pass with this interpreter (e.g. {T}test_gui); "
        "they are left out of its instances' checks"
    ), lines
    assert lines[1].startswith("SWE offline: validated 1 snapshots with python "), lines
    entry = load_env_record()[SWERuntime(dataset).validation_key(dataset.get("envcheck-1"))]
    assert entry["failing"] == [f"{T}test_gui"] and entry["passed"] == 2, entry

    after = asyncio.run(evaluate_predictions(dataset, gold_predictions(dataset), workers=2))
    assert after[0].status == "resolved", after[0]
    assert after[0].env_excluded == [f"{T}test_gui"] and after[0].pass_to_pass_total == 1
    assert after[0].fail_to_pass == {f"{T}test_double": True}
    assert after[1].status == "error" and "can pass in this environment" in (after[1].error or "")
    assert after[1].env_excluded == [f"{T}test_gui"]
    summary = summarize(after)
    counts = [summary[k] for k in ("resolved", "env_excluded_instances", "env_excluded_tests")]
    assert counts == [1, 2, 2], summary
    assert "validates the environment" not in capsys.readouterr().err

    # a second setup finds the record: nothing runs again
    start = time.perf_counter()
    again = validate_environment(dataset)
    assert [(v.cached, v.failing) for v in again] == [(True, [f"{T}test_gui"])]
    assert time.perf_counter() - start < seconds
