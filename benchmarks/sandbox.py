"""Sandbox start-up, density, memory and server round trip (BENCHMARKS.md, ``sandbox``), in root
mode and rootless mode side by side.

Prints, measured in one run for each mode:
- ``create_exec_close_p50_ms`` / ``_p95_ms``: a fresh bubblewrap sandbox, ``exec("true")``, close;
- ``subprocess_p50_ms``: the same for a plain subprocess (``true``), and ``overhead_ratio`` =
  bwrap p50 / subprocess p50;
- ``max_open``: the most sandboxes held open at once before any failure (each checked with an
  ``exec``; the probe stops at 512);
- ``rss_per_sandbox_mib``: resident memory (VmRSS of every process in the sandboxes) per open idle
  sandbox, and ``system_mib_per_sandbox``: the drop of the machine's MemAvailable per sandbox (kernel
  memory of namespaces, mounts and cgroups included; for sizing);
- ``server_exec_p50_ms``: ``exec("true")`` round trip through a real sandbox server
  (``horizon sandbox serve``, uvicorn) on loopback, via the remote backend;
- ``limits_by``: how memory and processes are limited in that mode here (cgroup or rlimit).

Run as root, it measures root mode itself and rootless mode in a child run as the ordinary user of
tests/test_nonroot.py (``horizonrl-ci``, created if missing); run as an ordinary user, rootless only.

    python benchmarks/sandbox.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from horizonrl.sandbox.base import SandboxSpec
from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def create_exec_close(backend: BwrapBackend, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        async with await backend.create() as box:
            result = await box.exec("true")
        times.append((time.perf_counter() - start) * 1000)
        assert result.exit_code == 0, result
    return times


async def plain_subprocess(n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec("true")
        await proc.wait()
        times.append((time.perf_counter() - start) * 1000)
    return times


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def sandbox_pids(boxes: list) -> list[int]:
    pids: list[int] = []
    for box in boxes:
        cgroup = box._cgroup
        if cgroup is not None:
            pids += cgroup.pids()
        else:  # no cgroup: bwrap, the sandbox's PID 1 and the holder
            pids += sorted(box._keep)
    return pids


async def density(backend: BwrapBackend, cap: int, batch: int = 16) -> tuple[int, float, float, str]:
    """Open sandboxes (``batch`` at a time, each checked with an exec) until one fails or ``cap``."""
    boxes: list = []
    failure = ""
    available_before = mem_available_mib()
    try:
        while len(boxes) < cap:
            size = min(batch, cap - len(boxes))
            created = await asyncio.gather(*(backend.create() for _ in range(size)), return_exceptions=True)
            ok = [b for b in created if not isinstance(b, BaseException)]
            boxes += ok
            errors = [b for b in created if isinstance(b, BaseException)]
            if errors:
                failure = f"create: {errors[0]}"
                break
            results = await asyncio.gather(*(b.exec("echo ok") for b in ok), return_exceptions=True)
            bad = [r for r in results if isinstance(r, BaseException) or r.stdout != "ok\n"]
            if bad:
                failure = f"exec: {bad[0]}"
                boxes = boxes[: len(boxes) - len(ok)]
                break
        await asyncio.sleep(1.0)  # idle
        n = len(boxes)
        rss = rss_mib(sandbox_pids(boxes)) / max(n, 1)
        system = (available_before - mem_available_mib()) / max(n, 1)
    finally:
        await backend.aclose()
    return n, rss, system, failure


async def server_round_trip(n: int, state_dir: str) -> list[float]:
    """exec("true") through a real `horizon sandbox serve` process on loopback."""
    from horizonrl.sandbox.remote import RemoteBackend
    from horizonrl.sandbox.server import serve_in_subprocess

    with serve_in_subprocess(state_dir) as (url, token):
        backend = RemoteBackend(url, token)
        times = []
        try:
            async with await backend.create(SandboxSpec()) as box:
                for _ in range(20):  # warm up the connection and the server
                    await box.exec("true")
                for _ in range(n):
                    start = time.perf_counter()
                    result = await box.exec("true")
                    times.append((time.perf_counter() - start) * 1000)
                    assert result.exit_code == 0, result
        finally:
            await backend.aclose()
        return times


async def measure(quick: bool) -> dict[str, float | int | str]:
    """Every figure, in the mode this process runs in."""
    n = 30 if quick else 200
    with tempfile.TemporaryDirectory(prefix="horizonrl-bench-") as tmp:
        options = BwrapOptions(state_dir=f"{tmp}/state", cache_dir=f"{tmp}/cache", max_sandboxes=1024)
        backend = BwrapBackend(options)
        await create_exec_close(backend, 5)  # warm up (template git layer, page cache)
        async with await backend.create() as box:
            limits_by = box.info().limits_by
        bwrap_ms = []
        plain_ms = []
        for _ in range(n // 10):  # interleaved, so both see the same machine state
            bwrap_ms += await create_exec_close(backend, 10)
            plain_ms += await plain_subprocess(10)
        await backend.aclose()
        opened, rss, system, failure = await density(BwrapBackend(options), CAP)
        server_ms = await server_round_trip(n, tmp)
    bwrap_p50, plain_p50 = statistics.median(bwrap_ms), statistics.median(plain_ms)
    return {
        "mode": backend.mode,
        "limits_by": str(limits_by),
        "samples": len(bwrap_ms),
        "create_exec_close_p50_ms": round(bwrap_p50, 1),
        "create_exec_close_p95_ms": round(percentile(bwrap_ms, 0.95), 1),
        "subprocess_p50_ms": round(plain_p50, 2),
        "overhead_ratio": round(bwrap_p50 / plain_p50, 1),
        "max_open": opened,
        "max_open_stopped_by": f"probe cap {CAP}" if opened >= CAP else failure,
        "rss_per_sandbox_mib": round(rss, 2),
        "system_mib_per_sandbox": round(system, 2),
        "server_exec_p50_ms": round(statistics.median(server_ms), 1),
        "server_exec_p95_ms": round(percentile(server_ms, 0.95), 1),
    }


CAP = 512
TARGETS = {"create_exec_close_p50_ms": "<= 50", "max_open": ">= 200", "rss_per_sandbox_mib": "<= 10"}


def rootless_as_ordinary_user(quick: bool) -> dict[str, float | int | str]:
    """The same measurements in a child run as the ordinary user of tests/test_nonroot.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_nonroot import NoOrdinaryUser, ordinary_user

    try:
        with ordinary_user() as session:
            argv = session.python(__file__, "--json", *(["--quick"] if quick else []))
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            user = f"{session.user.pw_name} (uid {session.user.pw_uid})"
    except NoOrdinaryUser as exc:
        return {"mode": "rootless", "error": str(exc)}
    if done.returncode:
        return {"mode": "rootless", "error": " ".join(done.stderr.split())[-300:]}
    return {**json.loads(done.stdout.splitlines()[-1]), "user": user}


def report(results: list[dict[str, float | int | str]]) -> None:
    """One row per figure, one column per mode, and the target where there is one."""
    keys = [k for k in results[0] if k != "mode"]
    keys += [k for r in results[1:] for k in r if k not in keys and k != "mode"]
    print(f"{'figure':<28}" + "".join(f"{r['mode']:>24}" for r in results) + "   target")
    for key in keys:
        cells = "".join(f"{r.get(key, '-')!s:>24}" for r in results)
        print(f"{key:<28}{cells}   {TARGETS.get(key, '')}")


def main(quick: bool, as_json: bool) -> None:
    figures = asyncio.run(measure(quick))
    if as_json:
        print(json.dumps(figures))
        return
    results = [figures]
    if os.geteuid() == 0:
        results.append(rootless_as_ordinary_user(quick))
    report(results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 samples instead of 200")
    parser.add_argument("--json", action="store_true", help="this mode's figures as one JSON line")
    args = parser.parse_args()
    main(args.quick, args.json)
