"""Memory freed inside the process goes back to the system after long work (``io.memory.return_freed_memory``):
glibc keeps what TensorFlow frees in its arenas (a bfloat16 Gemma-3-1B-shaped model held 5.8 GB after its first
map where 2.6 GB were alive)."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from gradscope.io.memory import return_freed_memory


def _rss_mb() -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_memory_freed_on_the_heap_goes_back_to_the_system():
    blocks = [np.ones(12_000) for _ in range(3000)]  # 96 KB each, under malloc's mmap threshold: 288 MB of heap
    pin = np.ones(12_000)  # allocated last, it holds the heap's top: freeing the rest gives nothing back by itself
    del blocks
    held = _rss_mb()
    return_freed_memory()
    assert _rss_mb() < held - 200, (held, _rss_mb())
    assert pin.sum() == 12_000
    return_freed_memory()  # again, with nothing to give back: harmless
