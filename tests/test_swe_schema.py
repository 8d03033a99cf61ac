"""SWE-bench's own instance schema (JSON-encoded test lists, extra fields, derived snapshot and test
command), ``test_patch`` applied before the tests, and the evaluation's apply fallbacks (``--3way``,
``patch --fuzz``) and ``partial`` status — on a hand-written dataset of a tiny package, evaluated in
real sandboxes with its real tests."""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from horizonrl.envs.swe.bugs.factory import fix_patch
from horizonrl.envs.swe.bugs.mutations import Mutation
from horizonrl.envs.swe.evaluate import SWERuntime
from horizonrl.envs.swe.instances import Dataset, SWEInstance, read_instances, write_instances
from horizonrl.errors import DataError

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it", allow_module_level=True)

ORIGINAL = """def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b


def double(x):
    return 2 * x
"""
TESTS = """from calc import add, double, mul, sub


def test_add():
    assert add(2, 3) == 5


def test_sub():
    assert sub(5, 3) == 2


def test_mul():
    assert mul(2, 3) == 6


def test_double():
    assert double(4) == 8
"""
SUB_BUG = ORIGINAL.replace("return a - b", "return a + b")
TWO_BUGS = SUB_BUG.replace("return 2 * x", "return 3 * x")
NEW_TEST = "from calc import sub\n\n\ndef test_sub_negative():\n    assert sub(1, 4) == -3\n"
T = "tests/test_calc.py::"


def diff(path: str, old: str, new: str, context: int = 3) -> str:
    """A git-style diff of ``path`` from ``old`` to ``new`` (the factory's own patch writer)."""
    if context == 3:
        return fix_patch(Mutation("x", path, 1, None, new, old, ""))
    lines = difflib.unified_diff(
        old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}", n=context
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def blob(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sdist(path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {"calc/__init__.py": ORIGINAL, "tests/test_calc.py": TESTS}.items():
            info = tarfile.TarInfo(f"calc-1.0/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    path.write_bytes(buffer.getvalue())


def swe_bench_record(instance_id: str, buggy: str, f2p: list[str], **extra: object) -> dict[str, object]:
    """A record exactly as SWE-bench ships it: test lists as JSON strings, no horizonrl fields."""
    return {
        "instance_id": instance_id,
        "repo": "acme/calc",
        "base_commit": "0" * 40,
        "patch": diff("calc/__init__.py", buggy, ORIGINAL),
        "test_patch": "",
        "problem_statement": "sub() and double() give wrong results",
        "hints_text": "look at the arithmetic",
        "created_at": "2024-01-02T03:04:05Z",
        "version": "1.0",
        "environment_setup_commit": "f" * 40,
        "FAIL_TO_PASS": json.dumps(f2p),
        "PASS_TO_PASS": json.dumps([f"{T}test_add", f"{T}test_mul"]),
        "image_name": "acme/calc:1.0",
        **extra,
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    root = tmp_path_factory.mktemp("swe_bench_format")
    (root / "packages").mkdir()
    sdist(root / "packages" / "calc-1.0.tar.gz")
    test_patch = diff("tests/test_new.py", "", NEW_TEST).replace(
        "--- a/tests/test_new.py", "new file mode 100644\n--- /dev/null"
    )
    records = [
        swe_bench_record("calc-1", SUB_BUG, [f"{T}test_sub"]),
        swe_bench_record("calc-2", TWO_BUGS, [f"{T}test_sub", f"{T}test_double"]),
        swe_bench_record(
            "calc-3", SUB_BUG, [f"{T}test_sub", "tests/test_new.py::test_sub_negative"], test_patch=test_patch
        ),
    ]
    (root / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return Dataset(root)


async def evaluate(dataset: Dataset, instance_id: str, patch: str):
    runtime = SWERuntime(dataset)
    try:
        return await runtime.evaluate(dataset.get(instance_id), patch)
    finally:
        await runtime.aclose()


def test_a_swe_bench_record_loads_with_its_fields_and_round_trips(dataset: Dataset, tmp_path: Path) -> None:
    inst = dataset.get("calc-2")
    decoded = inst.FAIL_TO_PASS  # from SWE-bench's JSON-encoded string
    assert decoded == [f"{T}test_sub", f"{T}test_double"]
    assert inst.snapshot == "calc-1.0.tar.gz" and inst.test_command == ""  # derived / default
    assert inst.model_extra == {"image_name": "acme/calc:1.0"}  # extra fields kept
    write_instances(tmp_path / "again.jsonl", list(dataset.instances.values()))
    again = {i.instance_id: i for i in read_instances(tmp_path / "again.jsonl")}
    assert again == dataset.instances
    fields = ("hints_text", "created_at", "version", "environment_setup_commit", "image_name")
    assert {f: getattr(again["calc-2"], f) for f in fields} == {
        "hints_text": "look at the arithmetic",
        "created_at": "2024-01-02T03:04:05Z",
        "version": "1.0",
        "environment_setup_commit": "f" * 40,
        "image_name": "acme/calc:1.0",
    }


def test_a_test_list_that_is_not_json_is_a_one_line_error_naming_the_field(tmp_path: Path) -> None:
    record = swe_bench_record("calc-x", SUB_BUG, [], FAIL_TO_PASS="tests/test_calc.py::test_sub")
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError) as info:
        read_instances(tmp_path / "bad.jsonl")
    message = str(info.value)
    assert "bad.jsonl:1" in message and "FAIL_TO_PASS" in message and "JSON-encoded list" in message
    assert "\n" not in message
    with pytest.raises(ValueError, match="JSON-encoded list"):
        SWEInstance.model_validate({**record, "FAIL_TO_PASS": '{"a": 1}'})


async def test_gold_resolves_a_swe_bench_record_with_derived_snapshot_and_command(dataset: Dataset) -> None:
    report = await evaluate(dataset, "calc-1", dataset.get("calc-1").patch)
    assert report.status == "resolved" and report.apply == "git apply", report
    assert report.fail_to_pass == {f"{T}test_sub": True} and report.pass_to_pass_total == 2


async def test_the_test_patch_is_applied_before_the_tests_run(dataset: Dataset) -> None:
    gold = await evaluate(dataset, "calc-3", dataset.get("calc-3").patch)
    assert gold.status == "resolved", gold  # its new test exists only through the test_patch
    assert gold.fail_to_pass == {f"{T}test_sub": True, "tests/test_new.py::test_sub_negative": True}
    empty = await evaluate(dataset, "calc-3", "")
    assert (
        empty.status == "unresolved" and empty.fail_to_pass["tests/test_new.py::test_sub_negative"] is False
    )


async def test_a_partial_fix_is_partial(dataset: Dataset) -> None:
    half = diff("calc/__init__.py", TWO_BUGS, ORIGINAL.replace("return 2 * x", "return 3 * x"))
    report = await evaluate(dataset, "calc-2", half)
    assert report.status == "partial", report
    assert report.fail_to_pass == {f"{T}test_sub": True, f"{T}test_double": False}


async def test_the_3way_fallback_merges_a_patch_made_against_another_version(dataset: Dataset) -> None:
    # made against the original module (whose blob the repository holds), its context includes
    # the buggy line: plain `git apply` refuses it, the 3-way merge applies it
    changed = ORIGINAL.replace("return a * b", "return b * a")
    patch = diff("calc/__init__.py", ORIGINAL, changed, context=5).replace(
        "--- a/", f"index {blob(ORIGINAL)[:12]}..{blob(changed)[:12]} 100644\n--- a/", 1
    )
    report = await evaluate(dataset, "calc-1", patch)
    assert report.apply == "git apply --3way", report.log
    assert report.status == "unresolved" and not report.pass_to_pass_failed  # merged cleanly, bug kept


async def test_the_fuzz_fallback_applies_a_fix_whose_context_drifted(dataset: Dataset) -> None:
    drifted = dataset.get("calc-1").patch.replace(" def mul(a, b):", " def mul(x, y):")
    assert drifted != dataset.get("calc-1").patch
    report = await evaluate(dataset, "calc-1", drifted)
    assert report.apply == "patch --fuzz" and report.status == "resolved", report.log


async def test_a_patch_adding_a_conftest_cannot_skip_the_tests(dataset: Dataset) -> None:
    cheat = diff("tests/conftest.py", "", "import pytest\n\npytestmark = pytest.mark.skip\n").replace(
        "--- a/tests/conftest.py", "new file mode 100644\n--- /dev/null"
    )
    cheat += diff("tests/test_calc.py", TESTS, TESTS.replace("== 2", "== 8"))
    report = await evaluate(dataset, "calc-1", cheat)
    assert report.apply is not None and report.status == "unresolved"
    assert report.fail_to_pass == {f"{T}test_sub": False}


@pytest.mark.parametrize("with_filter", [True, False], ids=["data-filter", "by-hand"])
def test_unpacking_a_snapshot_refuses_a_member_that_escapes_the_tree(tmp_path, monkeypatch, with_filter):
    """Pythons before 3.11.4 lack tarfile's data filter: the same refusals then hold by hand."""
    from horizonrl.envs.swe.instances import safe_extract

    if not with_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    for name, kind in (("pkg-1.0/../../evil.txt", tarfile.REGTYPE), ("pkg-1.0/link", tarfile.SYMTYPE)):
        archive = tmp_path / f"{kind!r}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "../../../etc/passwd" if kind == tarfile.SYMTYPE else ""
            data = b"x" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        dest = tmp_path / f"out-{kind!r}"
        dest.mkdir()
        with tarfile.open(archive) as tar, pytest.raises(Exception, match=r"outside|link|path"):
            safe_extract(tar, dest)
        assert not (tmp_path / "evil.txt").exists()
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        info = tarfile.TarInfo("pkg-1.0/mod.py")
        info.size, info.uid, info.gid, info.mode = 3, 4242, 4242, 0o4777  # a stranger's setuid file
        tar.addfile(info, io.BytesIO(b"x=1"))
    with tarfile.open(good) as tar:
        safe_extract(tar, tmp_path / "ok")
    unpacked = tmp_path / "ok" / "pkg-1.0" / "mod.py"
    assert unpacked.read_text() == "x=1"
    st = unpacked.stat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert not st.st_mode & 0o7022  # no setuid/setgid/sticky, not writable by others
