"""What the sandbox server's limits cost: exec round trips per second through a real server with its
ceilings and workspace quota on (the defaults of ``horizon sandbox serve``) against the same server
with them off (``ServerLimits.off()``), side by side in one run (docs/sandboxes.md, "Limits").

Two real servers (``serve`` in subprocesses, bubblewrap backend, uvicorn on loopback) run at once;
one client (:class:`RemoteBackend`) per server opens a sandbox, writes ``--files`` small files into
its workspace (what the quota measures after every exec: an agent's edits and new files), then both
run ``exec("true")`` in interleaved rounds, so both see the same machine load. Prints each side's
round trips per second (the median over rounds) and the ratio on/off (target >= 0.95).

    python benchmarks/sandbox_limits.py [--rounds 30] [--execs 20] [--files 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

from horizonrl.local_server import free_port, healthy_process
from horizonrl.sandbox.remote import RemoteBackend, RemoteSandbox

SERVER = """
import sys
from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions
from horizonrl.sandbox.server import ServerLimits, serve
state, port, token, on = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "on"
backend = BwrapBackend(BwrapOptions(state_dir=state + "/state", cache_dir=state + "/cache"))
serve("127.0.0.1", port, token, backend=backend, limits=ServerLimits() if on else ServerLimits.off())
"""


@contextlib.contextmanager
def server(tmp: str, limits_on: bool) -> Iterator[tuple[str, str]]:
    token, port = secrets.token_hex(16), free_port()
    state = tempfile.mkdtemp(dir=tmp)
    command = [sys.executable, "-c", SERVER, state, str(port), token, "on" if limits_on else "off"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with healthy_process(command, f"http://127.0.0.1:{port}", env=env):
        yield f"http://127.0.0.1:{port}", token


async def execs_per_s(box: RemoteSandbox, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        result = await box.exec("true")
        assert result.ok, result
    return n / (time.perf_counter() - start)


async def measure(urls: dict[str, tuple[str, str]], rounds: int, execs: int, files: int) -> dict[str, float]:
    backends = {side: RemoteBackend(url, token) for side, (url, token) in urls.items()}
    try:
        boxes = {side: await backend.create() for side, backend in backends.items()}
        for box in boxes.values():
            script = f"mkdir -p src && for i in $(seq {files}); do echo 'print($i)' > src/m$i.py; done"
            assert (await box.exec(script)).ok
            await execs_per_s(box, 20)  # warm up the connection and the server
        rates: dict[str, list[float]] = {side: [] for side in boxes}
        for i in range(rounds):
            order = list(boxes) if i % 2 == 0 else list(reversed(boxes))
            for side in order:
                rates[side].append(await execs_per_s(boxes[side], execs))
        return {side: statistics.median(r) for side, r in rates.items()}
    finally:
        for backend in backends.values():
            await backend.aclose()


def main(rounds: int, execs: int, files: int) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="horizonrl-bench-") as tmp,
        server(tmp, True) as on,
        server(tmp, False) as off,
    ):
        rates = asyncio.run(measure({"on": on, "off": off}, rounds, execs, files))
    ratio = rates["on"] / rates["off"]
    print(
        f"sandbox server exec round trips/s: limits on {rates['on']:.1f}, off {rates['off']:.1f}, "
        f"ratio {ratio:.3f} (target >= 0.95; median of {rounds} interleaved rounds x {execs} execs, "
        f"{files} files in each workspace)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds per side")
    parser.add_argument("--execs", type=int, default=20, help="execs per round")
    parser.add_argument("--files", type=int, default=200, help="small files in each workspace")
    args = parser.parse_args()
    main(args.rounds, args.execs, args.files)
