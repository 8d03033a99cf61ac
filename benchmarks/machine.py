"""What the benchmarks print about the machine they ran on."""

from __future__ import annotations

import os
import platform


def machine_description() -> str:
    """The processor's model name and core count ("Intel(R) Xeon(R) Processor @ 2.50GHz, 2 cores"; the
    model from ``/proc/cpuinfo``, as ``lscpu`` shows it, else ``platform.processor()``)."""
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), None)
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown"
    return f"{model}, {os.cpu_count()} cores"
