"""The bwrap backend's command lines (sandbox/bwrap/cmdline.py): pure functions, checked without
starting a sandbox (tests/test_sandbox_bwrap.py runs them for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonrl.sandbox.base import SandboxError, SandboxLimits
from horizonrl.sandbox.bwrap.cgroup import Cgroup
from horizonrl.sandbox.bwrap.cmdline import (
    ETC_FILES,
    bwrap_argv,
    bwrap_base_args,
    enter_argv,
    exec_prologue,
    overlay_options,
    start_argv,
)

LIMITS = SandboxLimits(cpu_s=30, memory_mib=300, processes=50, file_size_mib=2, tmp_mib=8)


def test_base_args_isolate_and_show_only_a_short_list_of_etc(tmp_path: Path) -> None:
    args = bwrap_base_args([str(tmp_path)])
    assert args[:5] == ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    assert ["--ro-bind", str(tmp_path), str(tmp_path)] == args[args.index(str(tmp_path)) - 1 :][:3]
    assert not {"shadow", "sudoers", "ssh"} & set(ETC_FILES)
    with pytest.raises(SandboxError, match="ro_binds: '/no/such/path' does not exist"):
        bwrap_base_args(["/no/such/path"])


def test_the_sandbox_command_mounts_the_overlay_and_holds_the_namespaces() -> None:
    argv = bwrap_argv(["--base"], LIMITS, Path("/s/workspace"), 7)
    assert argv[:2] == ["bwrap", "--base"]
    assert argv[argv.index("--size") + 1] == str(8 * 1024 * 1024)
    assert argv[argv.index("--bind") :][:3] == ["--bind", "/s/workspace", "/workspace"]
    assert argv[argv.index("/") - 1 :][:2] == ["--remount-ro", "/"]
    assert argv[argv.index("--info-fd") + 1] == "7"
    assert argv[-3:] == ["/bin/sh", "-c", "echo ready && exec cat > /dev/null"]


def test_binds_under_tmp_are_mounted_again_over_the_private_tmp() -> None:
    base = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/tmp/ci/.venv", "/tmp/ci/.venv", "--proc", "/proc"]
    argv = bwrap_argv(base, LIMITS, Path("/s/workspace"), 7)
    after_tmpfs = argv[argv.index("--tmpfs") + 2 :]
    assert after_tmpfs[:3] == ["--ro-bind", "/tmp/ci/.venv", "/tmp/ci/.venv"]
    assert "/usr" not in after_tmpfs[:3]


@pytest.mark.parametrize("rootless", [False, True])
def test_the_start_up_chain_of_each_mode(rootless: bool) -> None:
    overlay = overlay_options([Path("/a"), Path("/b")], Path("/u"), Path("/w"), rootless)
    assert overlay.endswith("lowerdir=/a:/b,upperdir=/u,workdir=/w")
    assert overlay.startswith("userxattr,") == rootless
    cgroup = Cgroup([Path("/sys/fs/cgroup/horizonrl/it's")])
    argv = start_argv(LIMITS, cgroup, overlay, Path("/m"), rootless)
    assert argv[0] == "unshare" and ("--map-root-user" in argv) == rootless
    script = argv[argv.index("-c") + 1]
    assert script.startswith("echo $$ > '/sys/fs/cgroup/horizonrl/it'\"'\"'s/cgroup.procs' && ulimit -t 30")
    assert argv[argv.index("-c") + 3 : argv.index("-c") + 5] == [overlay, "/m"]
    assert (argv[-3:] == ["prlimit", "--nproc=50", "--"]) == rootless


def test_commands_enter_without_capabilities() -> None:
    argv = enter_argv(42, rootless=True, own_user_ns=True)
    assert argv[:4] == ["nsenter", "--target=42", "--preserve-credentials", "--user"]
    assert argv[-5:] == ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    assert "--preserve-credentials" not in enter_argv(42, rootless=False, own_user_ns=False)


def test_the_exec_prologue_limits_memory_per_process_only_without_a_cgroup() -> None:
    assert exec_prologue(LIMITS, None).split(" && ") == [
        "ulimit -t 30",
        "ulimit -f 4096",
        "ulimit -c 0",
        "ulimit -v 307200",
    ]
    with_cgroup = exec_prologue(LIMITS, Cgroup([Path("/cg/a"), Path("/cg/b")]))
    assert with_cgroup.startswith("echo $$ > '/cg/a/cgroup.procs' && echo $$ > '/cg/b/cgroup.procs'")
    assert "ulimit -v" not in with_cgroup
