"""The sandbox server under abuse: clients asking for limits far above the server's ceilings (processes,
memory, /tmp, output), a process limit the kernel refuses (the sandbox must be refused, never run
without its cgroup), hundreds of background processes, a flood on stdout, and the disk filled through
exec, write_file, a background writer and several sandboxes at once; cgroups and writable layers
left behind after refusals and after the server stops.

The server is a real ``horizon sandbox serve`` process (``python -m horizonrl.cli``) on 127.0.0.1
with its default ceilings but ``--max-processes 10000000`` (so that a client's 10,000,000 reaches
the cgroup) and small workspace quotas (``--workspace-mib 16 --total-workspace-mib 40``: the quota
cases write megabytes, not gigabytes). No model is loaded."""

from __future__ import annotations

import base64
import contextlib
import os
import sys
import time
from pathlib import Path

import httpx

from abuse_probes import Case, Cases
from horizonrl.local_server import free_port, healthy_process

FAMILY = "sandbox server"
TOKEN = "probe-sandbox-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIB = 1024 * 1024
QUOTA_MIB, TOTAL_MIB = 16, 40
CEILINGS = {"memory_mib": 2048, "tmp_mib": 512, "output_bytes": MIB}  # the server's defaults
CGROUP_PARENTS = [Path("/sys/fs/cgroup", *p, "horizonrl") for p in [(), ("pids",), ("memory",), ("freezer",)]]


def _shown(res: httpx.Response) -> str:
    return f"{res.status_code} {res.text[:300]}"


def _one_line_error(res: httpx.Response, status: int, code: str, *words: str) -> bool:
    try:
        body = res.json()
    except ValueError:
        return False
    detail = body.get("detail") if isinstance(body, dict) else None
    return (
        res.status_code == status
        and body.get("code") == code
        and isinstance(detail, str)
        and "\n" not in detail
        and all(w in detail for w in words)
    )


def _disk(path: Path) -> int:
    total = 0
    for p in path.rglob("*") if path.exists() else []:
        with contextlib.suppress(OSError):
            total += p.lstat().st_blocks * 512
    return total


def _host_processes(cmdline: bytes) -> int:
    count = 0
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(cmdline):
                count += 1
    return count


def _cgroups(server_pid: int) -> list[str]:
    return [str(d) for p in CGROUP_PARENTS if p.is_dir() for d in p.glob(f"{server_pid}-*")]


def probe(workdir: Path) -> list[Case]:
    cases = Cases()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env.update({"HORIZON_SANDBOX_TOKEN": TOKEN, "TMPDIR": str(workdir), "OMP_NUM_THREADS": "1"})
    state = workdir / f"horizonrl-{os.geteuid()}" / "sandboxes"
    command = [sys.executable, "-m", "horizonrl.cli", "sandbox", "serve", "--port", str(port)]
    command += ["--log-level", "warning", "--max-processes", "10000000"]
    command += ["--workspace-mib", str(QUOTA_MIB), "--total-workspace-mib", str(TOTAL_MIB)]
    with healthy_process(command, url, env=env, start_timeout_s=120) as proc:
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
            _ceilings(cases, http)
            _process_limits(cases, http, proc.pid)
            _output(cases, http)
            _quota(cases, http, state)
            open_now = [s["id"] for s in http.get("/sandboxes").json()]
            for sandbox_id in open_now:
                http.delete(f"/sandboxes/{sandbox_id}")
        server_pid = proc.pid
    cases.check(
        "nothing left after the server stops (cgroups, writable layers)",
        lambda: (
            not _cgroups(server_pid) and not (state.exists() and any(state.iterdir())),
            f"cgroups {_cgroups(server_pid)}, layers {list(state.iterdir()) if state.exists() else []}",
        ),
    )
    return cases.cases


def _ceilings(cases: Cases, http: httpx.Client) -> None:
    for name, value in [
        ("processes", 10**9),
        *((n, 10**7) for n in ("memory_mib", "tmp_mib")),
        ("output_bytes", 10**12),
    ]:
        ceiling = 10_000_000 if name == "processes" else CEILINGS[name]

        def ask(name: str = name, value: int = value, ceiling: int = ceiling) -> tuple[bool, str]:
            res = http.post("/sandboxes", json={"limits": {name: value}})
            words = (f"limits.{name}={value}", f"ceiling of {ceiling}")
            return _one_line_error(res, 422, "limit_above_ceiling", *words), _shown(res)

        cases.check(f"{name}={value} above its ceiling is 422 naming limit, value and ceiling", ask)
    cases.check(
        "no sandbox was opened by the refused requests",
        lambda: (http.get("/sandboxes").json() == [], http.get("/sandboxes").text[:200]),
    )


def _process_limits(cases: Cases, http: httpx.Client, server_pid: int) -> None:
    def kernel_refuses() -> tuple[bool, str]:
        before = _cgroups(server_pid)
        res = http.post("/sandboxes", json={"limits": {"processes": 10_000_000}})
        refused = _one_line_error(res, 503, "unavailable", "cannot")
        return refused and _cgroups(server_pid) == before and http.get("/sandboxes").json() == [], _shown(res)

    cases.check("processes=10000000 that cannot be enforced is refused (503), no cgroup left", kernel_refuses)

    def background_600() -> tuple[bool, str]:
        box = http.post("/sandboxes", json={}).json()["id"]
        try:
            cmd = "for i in $(seq 600); do sleep 6061 & done 2>/dev/null; echo started"
            http.post(f"/sandboxes/{box}/exec", json={"cmd": cmd, "timeout": 60})
            running = _host_processes(b"sleep\x006061")
        finally:
            http.delete(f"/sandboxes/{box}")
        left = _host_processes(b"sleep\x006061")
        return 0 < running <= 256 and left == 0, f"{running} of 600 started (limit 256); {left} after delete"

    cases.check("600 background processes stop at the default process limit (256)", background_600)


def _output(cases: Cases, http: httpx.Client) -> None:
    flood = "head -c 30000000 /dev/zero | tr '\\0' x"
    for limits, most in [({}, 256 * 1024), ({"output_bytes": MIB}, MIB)]:

        def run(limits: dict = limits, most: int = most) -> tuple[bool, str]:
            box = http.post("/sandboxes", json={"limits": limits}).json()["id"]
            try:
                res = http.post(f"/sandboxes/{box}/exec", json={"cmd": flood, "timeout": 60})
                body = res.json()
                small = len(res.content) < 2 * most + 4096
                return small and body["truncated"] and "bytes cut" in body["stdout"], (
                    f"reply of {len(res.content)} bytes, truncated={body['truncated']}"
                )
            finally:
                http.delete(f"/sandboxes/{box}")

        cases.check(f"30 MB on stdout is cut to output_bytes={most} in the reply", run)


def _quota(cases: Cases, http: httpx.Client, state: Path) -> None:
    def new() -> str:
        return http.post("/sandboxes", json={}).json()["id"]

    def by_exec() -> tuple[bool, str]:
        box = new()
        try:
            cmd = "for i in 1 2 3; do head -c 10000000 /dev/zero > f$i; sleep 0.4; done; echo done"
            body = http.post(f"/sandboxes/{box}/exec", json={"cmd": cmd, "timeout": 60}).json()
            disk = _disk(state)
            held = body["over_quota"] and "done" not in body["stdout"] and "quota" in body["stderr"]
            return held and disk < (
                QUOTA_MIB + 12
            ) * MIB, f"over_quota={body['over_quota']}, disk {disk} bytes"
        finally:
            http.delete(f"/sandboxes/{box}")

    cases.check(f"three 10 MB files by exec stop at the {QUOTA_MIB} MiB workspace quota", by_exec)

    def by_write_file() -> tuple[bool, str]:
        box = new()
        try:
            data = base64.b64encode(b"x" * (6 * MIB)).decode()
            answers = [
                http.post(f"/sandboxes/{box}/files/write", json={"path": f"w{i}", "data": data})
                for i in range(4)
            ]
            refused = [r for r in answers if r.status_code != 204]
            held = bool(refused) and all(_one_line_error(r, 409, "quota_exceeded", "quota") for r in refused)
            return held and _disk(state) <= (QUOTA_MIB + 1) * MIB, ", ".join(
                str(r.status_code) for r in answers
            )
        finally:
            http.delete(f"/sandboxes/{box}")

    cases.check("write_file past the workspace quota is 409 before it is written", by_write_file)

    def background() -> tuple[bool, str]:
        box = new()
        try:
            writer = "(while true; do head -c 1000000 /dev/zero >> log; sleep 0.2; done) >/dev/null 2>&1 &"
            http.post(f"/sandboxes/{box}/exec", json={"cmd": writer})
            sizes, deadline = [0], time.monotonic() + 20
            while (len(sizes) < 8 or sizes[-1] != sizes[-8]) and time.monotonic() < deadline:
                time.sleep(0.2)
                sizes.append(_disk(state))
            return sizes[-1] == sizes[-8] and sizes[-1] < (
                QUOTA_MIB + 12
            ) * MIB, f"disk {sizes[-1]} bytes, stable"
        finally:
            http.delete(f"/sandboxes/{box}")

    cases.check("a background writer is killed soon after it passes the quota", background)

    def server_total() -> tuple[bool, str]:
        boxes = [new(), new(), new()]
        try:
            results = [
                http.post(f"/sandboxes/{b}/exec", json={"cmd": "head -c 15000000 /dev/zero > f"}).json()
                for b in boxes
            ]
            flagged = [r["over_quota"] for r in results]
            refused = http.post("/sandboxes", json={})
            held = flagged == [False, False, True] and _one_line_error(refused, 429, "capacity", "quota")
            return held, f"over_quota {flagged}; a new sandbox: {_shown(refused)}"
        finally:
            for b in boxes:
                http.delete(f"/sandboxes/{b}")

    cases.check(
        f"all workspaces together stop at the server's {TOTAL_MIB} MiB (429 for new ones)", server_total
    )
