"""The bubblewrap sandbox backend: real sandboxes on this machine, and every escape attempt (fork
bomb, infinite loop, output flood, memory hog, ``rm -rf /``, host files, network, path traversal)
contained with the host unchanged and the sandbox still usable.

The module runs as whoever runs pytest: as root (root mode: cgroups) and, through
tests/test_nonroot.py, as an ordinary user (rootless mode: user namespaces of the user's own and
rlimits, or a delegated cgroup), so every probe here holds in both modes."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from horizonrl.sandbox.base import (
    SandboxCapacityError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLimits,
    SandboxPathError,
    SandboxSpec,
    SandboxUnavailableError,
)
from horizonrl.sandbox.bwrap import (
    BwrapBackend,
    BwrapOptions,
    default_state_dir,
    delegated_cgroup,
    ensure_private_dir,
    reap_stale,
)
from horizonrl.sandbox.bwrap.cgroup import CGROUP_PARENTS
from horizonrl.sandbox.bwrap.usage import UsageError

if shutil.which("bwrap") is None:  # never silently: the reason is printed with -ra
    pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it", allow_module_level=True)

PROJECT = Path(__file__).resolve().parents[1]
ROOT = os.geteuid() == 0


@pytest.fixture
def options(tmp_path: Path) -> BwrapOptions:
    return BwrapOptions(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"))


@pytest.fixture
async def backend(options: BwrapOptions):
    backend = BwrapBackend(options)
    yield backend
    await backend.aclose()


@pytest.fixture
def template(tmp_path: Path) -> Path:
    root = tmp_path / "template"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def answer():\n    return 41\n")
    (root / "README.md").write_text("hello\n")
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def test_exec_runs_in_the_workspace_with_output_and_exit_code(backend: BwrapBackend) -> None:
    async with await backend.create() as box:
        result = await box.exec("pwd; echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "/workspace\nout\n", "err\n")
    assert not result.truncated and not result.timed_out and result.duration > 0


async def test_state_persists_between_execs_files_tmp_and_background_processes(backend: BwrapBackend) -> None:
    async with await backend.create() as box:
        await box.exec("echo 1 > a.txt; echo 2 > /tmp/b.txt; (sleep 30 &) ")
        result = await box.exec("cat a.txt /tmp/b.txt; ps -eo args | grep -c '^sleep 30'")
    assert result.stdout.split() == ["1", "2", "1"]


async def test_workspace_starts_from_the_template_which_is_never_modified(
    backend: BwrapBackend, template: Path
) -> None:
    before = tree(template)
    spec = SandboxSpec(template=str(template))
    async with await backend.create(spec) as one, await backend.create(spec) as two:
        assert (await one.exec("cat README.md")).stdout == "hello\n"
        await one.exec("echo changed > README.md; rm pkg/mod.py; echo new > new.txt")
        assert (await two.exec("cat README.md; ls pkg")).stdout == "hello\nmod.py\n"  # no cross-talk
    assert tree(template) == before


async def test_diff_is_the_agents_patch_including_new_deleted_and_binary_files(
    backend: BwrapBackend, template: Path
) -> None:
    async with await backend.create(SandboxSpec(template=str(template))) as box:
        assert await box.diff() == ""
        await box.write_file("pkg/mod.py", b"def answer():\n    return 42\n")
        await box.exec("rm README.md; printf '\\000\\001' > blob.bin; mkdir -p d && echo x > d/new.py")
        patch = await box.diff()
        staged = await box.exec("git status --porcelain")  # the agent's own index is left alone
    assert "-    return 41\n+    return 42" in patch
    assert "deleted file mode" in patch and "README.md" in patch
    assert "diff --git a/d/new.py b/d/new.py" in patch and "GIT binary patch" in patch
    assert " M pkg/mod.py" in staged.stdout and "?? d/" in staged.stdout
    # the patch applies to a clean copy of the template
    clean = template.parent / "clean"
    shutil.copytree(template, clean)
    subprocess.run(["git", "init", "-q"], cwd=clean, check=True)
    subprocess.run(["git", "apply", "-"], cwd=clean, input=patch.encode(), check=True)
    assert (clean / "pkg" / "mod.py").read_text().endswith("return 42\n") and not (
        clean / "README.md"
    ).exists()


async def test_read_and_write_file_round_trip_bytes(backend: BwrapBackend) -> None:
    payload = bytes(range(256)) * 100
    async with await backend.create() as box:
        await box.write_file("deep/er/data.bin", payload)
        await box.write_file("/workspace/abs.txt", b"absolute inside")
        assert await box.read_file("deep/er/data.bin") == payload
        assert await box.read_file("abs.txt") == b"absolute inside"
        with pytest.raises(SandboxFileNotFoundError, match=r"missing\.txt"):
            await box.read_file("missing.txt")


@pytest.mark.parametrize(
    "path", ["../../etc/passwd", "/etc/passwd", "..", "/workspace/../root/x", "link/x", "link"]
)
async def test_path_traversal_in_read_and_write_file_is_refused(backend: BwrapBackend, path: str) -> None:
    passwd = Path("/etc/passwd").read_bytes()
    async with await backend.create() as box:
        await box.exec("ln -s /etc link")
        with pytest.raises(SandboxPathError, match="outside"):
            await box.read_file(path)
        with pytest.raises(SandboxPathError, match="outside"):
            await box.write_file(path, b"owned")
        assert (await box.exec("echo still usable")).stdout == "still usable\n"
    assert Path("/etc/passwd").read_bytes() == passwd


async def test_bad_paths_get_a_clear_error(backend: BwrapBackend) -> None:
    async with await backend.create() as box:
        for path in ("", "  ", "a\0b"):
            with pytest.raises(SandboxPathError, match="path"):
                await box.read_file(path)


async def test_host_files_outside_the_workspace_are_invisible(backend: BwrapBackend, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    async with await backend.create() as box:
        result = await box.exec(f"cat /etc/shadow; ls /root; ls {PROJECT}; cat {secret}; ls /home")
        caps = await box.exec("grep CapEff /proc/self/status")
    assert "host secret" not in result.stdout and "root:" not in result.stdout
    for missing in ("/etc/shadow", "/root", str(PROJECT), str(secret)):
        assert any(missing in line and "No such file" in line for line in result.stderr.splitlines())
    assert caps.stdout.split() == ["CapEff:", "0000000000000000"]


async def test_a_read_only_bind_under_tmp_stays_visible_over_the_private_tmp(tmp_path: Path) -> None:
    # a checkout or venv under /tmp (a CI clone) must not be hidden by the sandbox's own /tmp
    shared = Path(tempfile.mkdtemp(prefix="horizonrl-bind-", dir="/tmp"))
    try:
        (shared / "tool.txt").write_text("visible\n")
        options = BwrapOptions(
            state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"), ro_binds=[str(shared)]
        )
        backend = BwrapBackend(options)
        try:
            async with await backend.create() as box:
                seen = await box.exec(f"cat {shared}/tool.txt; touch /tmp/mine && echo tmp-writable")
                denied = await box.exec(f"touch {shared}/new")
        finally:
            await backend.aclose()
        assert seen.stdout == "visible\ntmp-writable\n"
        assert denied.exit_code != 0 and not (shared / "new").exists()
    finally:
        shutil.rmtree(shared)


async def test_no_network_not_even_the_hosts_loopback(backend: BwrapBackend) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        async with await backend.create() as box:
            script = (
                "import socket\n"
                f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('pypi.org', 443)]:\n"
                "    try:\n"
                "        socket.create_connection(addr, timeout=2); print('connected', addr)\n"
                "    except OSError as e:\n"
                "        print('refused', type(e).__name__)\n"
            )
            await box.write_file("net.py", script.encode())
            result = await box.exec("python3 net.py", timeout=30)
    finally:
        server.close()
    assert "connected" not in result.stdout
    assert result.stdout.count("refused") == 3


async def test_infinite_loop_times_out_and_the_sandbox_stays_usable(backend: BwrapBackend) -> None:
    async with await backend.create() as box:
        start = time.perf_counter()
        result = await box.exec("while :; do :; done", timeout=1.0)
        assert result.timed_out and result.exit_code != 0
        assert time.perf_counter() - start < 5
        assert (await box.exec("echo ok")).stdout == "ok\n"


async def test_cpu_time_limit_kills_a_busy_process(backend: BwrapBackend) -> None:
    limits = SandboxLimits(cpu_s=1)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        result = await box.exec("while :; do :; done", timeout=20)
    assert not result.timed_out and result.exit_code != 0  # SIGXCPU/SIGKILL after 1 CPU second


async def test_a_gigabyte_on_stdout_is_cut_and_the_command_killed(backend: BwrapBackend) -> None:
    limits = SandboxLimits(output_bytes=4096)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        start = time.perf_counter()
        result = await box.exec("echo first; head -c 1000000000 /dev/zero | tr '\\0' x; echo", timeout=60)
        elapsed = time.perf_counter() - start
        assert (await box.exec("echo ok")).stdout == "ok\n"
    assert result.truncated and result.stdout.startswith("first\n")
    assert len(result.stdout) < 4096 + 100 and "bytes cut" in result.stdout
    assert elapsed < 10  # killed after 64x the limit, not after a gigabyte


async def test_fork_bomb_is_contained(backend: BwrapBackend) -> None:
    limits = SandboxLimits(processes=64)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        result = await box.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=5)
        assert result.exit_code != 0 or result.timed_out or "fork" in result.stderr.lower()
        after = await box.exec("echo ok", timeout=10)
        assert after.stdout == "ok\n", after
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


async def test_memory_hog_is_killed_and_the_sandbox_survives(backend: BwrapBackend) -> None:
    limits = SandboxLimits(memory_mib=128)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        result = await box.exec("python3 -c 'b = bytearray(1024 ** 3); print(len(b))'", timeout=60)
        assert result.exit_code != 0 and "1073741824" not in result.stdout
        assert (await box.exec("echo ok")).stdout == "ok\n"


async def test_file_size_limit(backend: BwrapBackend) -> None:
    limits = SandboxLimits(file_size_mib=1)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        result = await box.exec("head -c 3000000 /dev/zero > big; stat -c %s big")
    assert result.stdout.split()[-1] == str(1024 * 1024)


async def test_rm_rf_root_leaves_the_host_unchanged(backend: BwrapBackend, template: Path) -> None:
    before = tree(template)
    async with await backend.create(SandboxSpec(template=str(template))) as box:
        wipe = "rm -rf --no-preserve-root / 2>&1 | tail -1; ls /usr/bin/sh /dev/null"
        result = await box.exec(wipe, timeout=60)
        assert "/dev/null\n/usr/bin/sh\n" in result.stdout  # read-only system directories survive
        assert (await box.exec("echo ok")).stdout == "ok\n"
    assert tree(template) == before
    assert Path("/usr/bin/sh").exists() and Path("/etc/passwd").exists()


async def test_close_kills_every_process_even_detached_ones(backend: BwrapBackend) -> None:
    box = await backend.create()
    await box.exec("setsid sleep 4242 >/dev/null 2>&1 < /dev/null & sleep 0.1")
    assert _processes("sleep 4242")
    await box.close()
    await box.close()  # idempotent
    assert not _processes("sleep 4242")
    with pytest.raises(SandboxError, match="closed"):
        await box.exec("true")
    assert backend.live == 0


def _processes(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return out.split()


async def test_capacity_cap(options: BwrapOptions) -> None:
    backend = BwrapBackend(options.model_copy(update={"max_sandboxes": 2}))
    try:
        await backend.create()
        await backend.create()
        with pytest.raises(SandboxCapacityError, match="max_sandboxes=2"):
            await backend.create()
    finally:
        await backend.aclose()


async def test_sandbox_dies_with_its_parent_and_leftovers_are_reaped(options: BwrapOptions) -> None:
    code = (
        "import asyncio, sys\n"
        "from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions\n"
        "async def main():\n"
        f"    b = BwrapBackend(BwrapOptions.model_validate_json({options.model_dump_json()!r}))\n"
        "    s = await b.create()\n"
        "    await s.exec('sleep 4343 >/dev/null 2>&1 &')\n"
        "    print(s._pid, flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    holder = int(child.stdout.readline())
    assert Path(f"/proc/{holder}").exists() and _processes("sleep 4343")
    child.kill()
    child.wait()
    deadline = time.monotonic() + 5
    while (Path(f"/proc/{holder}").exists() or _processes("sleep 4343")) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not Path(f"/proc/{holder}").exists() and not _processes("sleep 4343")
    state = Path(options.state_dir)
    assert [p.name.split("-")[0] for p in state.iterdir()] == [str(child.pid)]  # left by the crash
    assert reap_stale(state) == 1 and not list(state.iterdir())
    cgroups = Path("/sys/fs/cgroup/pids/horizonrl")
    if ROOT and cgroups.is_dir():  # its cgroups are gone too
        assert not [d for d in cgroups.iterdir() if d.name.startswith(f"{child.pid}-")]


async def test_a_missing_template_is_a_clear_error(backend: BwrapBackend, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="not a directory"):
        await backend.create(SandboxSpec(template=str(tmp_path / "nope")))


async def test_many_sandboxes_at_once(backend: BwrapBackend) -> None:
    boxes = await asyncio.gather(*(backend.create() for _ in range(40)))
    results = await asyncio.gather(*(box.exec(f"echo {i}") for i, box in enumerate(boxes)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(40)]
    await asyncio.gather(*(box.close() for box in boxes))
    assert backend.live == 0 and not os.listdir(backend.state_dir)


def test_refuses_to_run_under_uvloop(options: BwrapOptions) -> None:
    uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed (it comes with uvicorn[standard])")

    async def create() -> None:
        await BwrapBackend(options).create()

    with pytest.raises(SandboxError, match="uvloop"):
        uvloop.run(create())


async def test_background_processes_filling_the_limit_are_cleared_by_the_next_exec(
    backend: BwrapBackend,
) -> None:
    limits = SandboxLimits(processes=32)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        await box.exec("for i in $(seq 60); do sleep 1000 & done", timeout=10)
        after = await box.exec("echo ok; ps -e | grep -c 'sleep 1000'", timeout=10)
    assert after.stdout == "ok\n0\n" and "process limit (32) was reached" in after.stderr, after


async def test_the_process_limit_is_per_sandbox_not_per_user(backend: BwrapBackend) -> None:
    """Rootless, RLIMIT_NPROC is counted in each sandbox's own user namespace: eight sandboxes of 16
    processes hold more processes of this user together than one sandbox may."""
    limits = SandboxLimits(processes=16)
    boxes = [await backend.create(SandboxSpec(limits=limits)) for _ in range(8)]
    try:
        results = [await box.exec("sleep 30 & sleep 30 & echo ok") for box in boxes]
    finally:
        await asyncio.gather(*(box.close() for box in boxes))
    assert [r.stdout for r in results] == ["ok\n"] * 8, results


async def test_sandbox_info_says_which_mode_and_limits_apply(backend: BwrapBackend) -> None:
    async with await backend.create() as box:
        info = box.info()
    if ROOT:
        cgroups = Path("/sys/fs/cgroup/pids").is_dir() or Path("/sys/fs/cgroup/cgroup.controllers").exists()
        assert (info.mode, info.limits_by) == ("root", "cgroup" if cgroups else "rlimit")
    else:
        delegated = delegated_cgroup()[0] is not None
        assert (info.mode, info.limits_by) == ("rootless", "cgroup" if delegated else "rlimit")
    assert backend.mode == info.mode


async def test_rootless_limits_use_a_delegated_cgroup_where_one_exists(backend: BwrapBackend) -> None:
    parent, why = delegated_cgroup()
    if ROOT or parent is None:
        pytest.skip(f"no delegated cgroup here ({'running as root' if ROOT else why})")
    limits = SandboxLimits(memory_mib=64, processes=20)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        groups = [d for d in parent.iterdir() if d.name.endswith(box.id)]
        hog = await box.exec("python3 -c 'b = bytearray(200 * 1024 ** 2)'", timeout=60)
    assert [(g / "pids.max").read_text().strip() for g in groups] == ["20"]
    assert (groups[0] / "memory.max").read_text().strip() == str(64 * 1024 * 1024)
    assert hog.exit_code != 0


def test_default_state_dir_is_the_users_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    default = Path(default_state_dir())
    assert default == tmp_path / f"horizonrl-{os.geteuid()}" / "sandboxes"
    ensure_private_dir(default)
    for directory in (default, default.parent):
        st = directory.stat()
        assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700
    runtime = tmp_path / "run"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert Path(default_state_dir()) == runtime / "horizonrl" / "sandboxes"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/usr" if not ROOT else str(_not_mine(tmp_path / "other")))
    assert Path(default_state_dir()).parent.name == f"horizonrl-{os.geteuid()}"  # not someone else's


def _not_mine(path: Path) -> Path:
    """(As root) a directory of another user's: nobody's."""
    path.mkdir()
    os.chown(path, 65534, 65534)
    return path


@pytest.mark.parametrize("case", ["world-writable", "another user's", "planted link"])
def test_a_state_dir_others_could_tamper_with_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    target = tmp_path / "state"
    if case == "world-writable":
        target.mkdir()
        target.chmod(0o777)
        expected = "writable by other users"
    elif case == "another user's":
        target = _not_mine(target) if ROOT else Path("/usr/share")
        expected = "belongs to uid"
    else:
        other = _not_mine(tmp_path / "theirs") if ROOT else Path("/usr/share")
        target.symlink_to(other)
        expected = "belongs to uid"
    with pytest.raises(SandboxUnavailableError) as caught:
        BwrapBackend(BwrapOptions(state_dir=str(target), cache_dir=str(tmp_path / "cache")))
    message = str(caught.value)
    assert expected in message and "state_dir" in message and "\n" not in message


# --- limits that cannot be enforced, and what a sandbox server's quota needs ----------------------


def _own_cgroups() -> list[str]:
    """Cgroup directories of this process's sandboxes (root's hierarchy, or the delegated group)."""
    parents = [*CGROUP_PARENTS, *([delegated_cgroup()[0]] if not ROOT and delegated_cgroup()[0] else [])]
    return [str(d) for p in parents if p is not None and p.is_dir() for d in p.glob(f"{os.getpid()}-*")]


async def test_a_process_limit_the_kernel_refuses_refuses_the_sandbox_and_leaves_nothing(
    backend: BwrapBackend,
) -> None:
    limits = SandboxLimits(processes=10_000_000)  # over the kernel's PID_MAX_LIMIT: pids.max refuses it
    hard_nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if not backend.uses_cgroups and not ROOT and hard_nproc not in (resource.RLIM_INFINITY,):
        # no cgroup: rlimits, the documented mechanism; one above the user's hard limit cannot be set
        with pytest.raises(
            SandboxUnavailableError, match=rf"cannot set RLIMIT_NPROC=10000000 .*{hard_nproc}"
        ):
            await backend.create(SandboxSpec(limits=limits))
        assert backend.live == 0 and not os.listdir(backend.state_dir)
        limits = SandboxLimits(processes=min(hard_nproc, 10_000))
    if not backend.uses_cgroups:  # within what rlimits can do: they apply
        async with await backend.create(SandboxSpec(limits=limits)) as box:
            assert box.info().limits_by == "rlimit" and (await box.exec("echo ok")).stdout == "ok\n"
        return
    before = _own_cgroups()
    with pytest.raises(
        SandboxUnavailableError, match=r"cannot set pids\.max=10000000 in .*: Invalid argument"
    ):
        await backend.create(SandboxSpec(limits=limits))
    assert backend.live == 0 and not os.listdir(backend.state_dir)
    assert _own_cgroups() == before


async def test_a_half_made_cgroup_is_removed_and_the_sandbox_refused(
    backend: BwrapBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not backend.uses_cgroups:
        pytest.skip("no cgroups here: rlimits apply")
    from horizonrl.sandbox.bwrap import cgroup

    real_set = cgroup._set

    def memory_refused(path: Path, value: str) -> None:
        if path.name.startswith("memory."):
            raise cgroup.CgroupError(
                f"cannot set {path.name}={value} in {path.parent}: Device or resource busy"
            )
        real_set(path, value)

    monkeypatch.setattr(cgroup, "_set", memory_refused)
    before = _own_cgroups()
    with pytest.raises(SandboxUnavailableError, match=r"limits cannot be enforced: cannot set memory\."):
        await backend.create()
    assert _own_cgroups() == before and not os.listdir(backend.state_dir)  # pids group made, then removed
    monkeypatch.setattr(cgroup, "_set", real_set)
    async with await backend.create() as box:
        assert (await box.exec("echo ok")).stdout == "ok\n"
    assert _own_cgroups() == before  # closed: its group is gone too


async def test_workspace_bytes_processes_and_kill_for_a_servers_quota(backend: BwrapBackend) -> None:
    async with await backend.create() as box:
        empty = await asyncio.to_thread(box.workspace_bytes)
        assert empty < 64 * 1024
        wrote = await box.exec(
            "head -c 3000000 /dev/urandom > a && ln a b && truncate -s 100M sparse && mkdir d && touch d/e"
        )
        assert wrote.ok, wrote
        used = await asyncio.to_thread(box.workspace_bytes)
        assert 3_000_000 <= used - empty < 3_300_000  # the hard link once, the sparse file's blocks only
        assert await asyncio.to_thread(box.workspace_bytes, 1024) < used  # stops counting past 1 KiB
        assert box.background_processes() == 0
        assert (await box.exec("sleep 300 > /dev/null 2>&1 & echo started")).ok
        assert box.background_processes() == 1
        assert box.kill_processes() == 1
        deadline = time.monotonic() + 5
        while box.background_processes() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert box.background_processes() == 0 and (await box.exec("echo alive")).stdout == "alive\n"
        await box.exec("chmod 000 d")
        if ROOT:  # root reads past permissions: still measured
            assert await asyncio.to_thread(box.workspace_bytes) >= used
        else:  # an unreadable directory is never silently left out
            with pytest.raises(UsageError, match="cannot read /workspace/d"):
                await asyncio.to_thread(box.workspace_bytes)
