"""Process memory: the peak resident set, and giving freed memory back to the OS."""

from __future__ import annotations

import contextlib
import ctypes
import resource


def peak_rss_gib() -> float:
    """Peak resident memory of this process and its children, GiB (Linux reports KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / (1024 * 1024)


def release_free_memory() -> None:
    """Give memory freed so far back to the OS.

    glibc keeps freed blocks in per-thread arenas: each allocating thread would hold its own
    high-water mark, and KV caches of varying shapes fragment the heap, so the peaks add up over a
    run. A no-op where glibc's ``malloc_trim`` is not available."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


_M_ARENA_MAX = -8  # glibc mallopt parameter


def limit_malloc_arenas(count: int = 2) -> None:
    """Cap glibc's malloc arenas for threads created from now on.

    Each thread that allocates (tokenizer, sandbox and torch worker threads)
    otherwise gets its own arena, and KV caches of ever-changing shapes fragment each one: measured
    on a 1280-trajectory rollout, peak memory grew 18% over a 128-trajectory one with default arenas
    and 6.5% with one arena. A no-op where glibc's ``mallopt`` is not available."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, count)


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
LARGE_BLOCK_BYTES = 1 << 20


def map_large_blocks(threshold: int = LARGE_BLOCK_BYTES) -> None:
    """Serve allocations of ``threshold`` bytes or more with their own mmap, returned to the OS on free.

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), after which the
    engine's KV buffers and logits (1-16 MiB, a new shape every few tokens) come from the heap, where
    long-lived conversation caches pin the pages around them. Measured on a 100-episode eval of
    SmolLM2-135M: peak resident memory 3.54 GiB with glibc's sliding threshold, 2.82 GiB with a fixed
    1 MiB one, for 15% more wall time (fresh pages are zero-filled). A fixed threshold also turns the
    sliding off. A no-op where glibc's ``mallopt`` is not available."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, int(threshold))
