"""Probe families for ``benchmarks/abuse.py``: each module exposes ``FAMILY`` (its name in the table)
and ``probe(workdir: Path) -> list[Case]``, which tries every case of its family against the real
component (a real server on 127.0.0.1, the real CLI in a subprocess, a real run directory) and says
for each whether it held."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One abusive input tried: ``held`` is True when the component answered as it must (one clear
    line / a 4xx with the reason / nothing written outside the run directory / no limit dropped);
    ``detail`` says what came back (the status and first line), so a failure can be read."""

    name: str
    held: bool
    detail: str = ""
