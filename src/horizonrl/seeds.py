"""Seeds derived from names: reproducible random streams that do not depend on execution order."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed determined by ``parts`` (their ``repr``), the same in every process and run.

    Used to give each (run seed, step, trajectory, turn) its own sampling stream, so what an episode
    samples does not depend on which other requests share the engine's batch or on when it ran —
    the property exact resume and side-by-side comparisons rely on."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
