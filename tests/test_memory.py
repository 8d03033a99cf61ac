"""Allocator settings: a fixed mmap threshold sends big blocks to their own mappings, which glibc's
sliding threshold stops doing once a mapped block was freed. Run in a child process so the
process-wide setting does not leak into other tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from horizonrl.config import load_config
from horizonrl.errors import ConfigError

PROBE = textwrap.dedent(
    """
    import ctypes, sys
    import torch
    from horizonrl.memory import map_large_blocks

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "fixed":
        map_large_blocks(1 << 20)
    freed = torch.ones(8 << 20, dtype=torch.uint8)
    del freed  # a freed mapped block raises glibc's sliding threshold to its size
    block = torch.ones(4 << 20, dtype=torch.uint8)
    print(libc.mallinfo2().hblkhd >= (4 << 20))
    """
)


def mapped_after_free(mode: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.strip().splitlines()[-1] == "True"


def test_a_fixed_threshold_keeps_mapping_big_blocks_where_the_sliding_one_stops() -> None:
    if sys.platform != "linux":
        pytest.skip("glibc mallopt/mallinfo2 exist on Linux only")
    assert not mapped_after_free("sliding")  # glibc's default: the 4 MiB block now comes from the heap
    assert mapped_after_free("fixed")


def test_the_threshold_setting_rejects_negative_sizes() -> None:
    with pytest.raises(ConfigError, match="mmap_threshold_mib"):
        load_config("configs/calc.yaml", ["engine.mmap_threshold_mib=-1"])
