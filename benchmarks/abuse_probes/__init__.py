"""Probe families for ``benchmarks/abuse.py``: each module exposes ``FAMILY`` (its name in the table)
and ``probe(workdir: Path) -> list[Case]``, which tries every case of its family against the real
component (a real server on 127.0.0.1, the real CLI in a subprocess, a real run directory) and says
for each whether it held."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One abusive input tried: ``held`` is True when the component answered as it must (one clear
    line / a 4xx with the reason / nothing written outside the run directory / no limit dropped);
    ``detail`` says what came back (the status and first line), so a failure can be read."""

    name: str
    held: bool
    detail: str = ""


class Cases:
    """The cases a probe tried, in order: :meth:`check` runs one and records whether it held (a case
    that raises did not hold, and its exception is the detail)."""

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def check(self, name: str, fn: Callable[[], tuple[bool, str]]) -> None:
        try:
            held, detail = fn()
        except Exception as exc:  # a case that crashes the probe did not hold
            held, detail = False, f"{type(exc).__name__}: {exc}"
        self.cases.append(Case(name, bool(held), detail))
