"""How much memory the machine can give this process now, for refusing work that cannot fit before it starts
(a 100,000-token prompt asked 11 GB of a tiny Llama before TensorFlow's out-of-memory error)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any


def available_bytes() -> int | None:
    """Linux's ``MemAvailable``, lowered to what a memory cgroup (a container's limit) still allows; else the
    free pages; None where the system does not say."""
    free = _meminfo_available()
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    room = _cgroup_room()
    return free if room is None else min(free, room)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """cgroup v2: ``memory.max`` less ``memory.current`` of this process's group (None: no limit, or not v2)."""
    try:
        group = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1]
        folder = Path("/sys/fs/cgroup") / group.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((folder / "memory.current").read_text()), 0)
    except (OSError, ValueError, IndexError):
        return None


def return_freed_memory() -> None:
    """Hand the memory freed inside the process back to the system (glibc's ``malloc_trim``; elsewhere nothing).
    TensorFlow frees a pass's tensors into glibc's arenas, which keep them: measured on a Gemma-3-1B-shaped model in
    bfloat16, the process held 5.8 GB after its first map where 2.6 GB were alive (2.3 GB back after a trim, which
    took 0-35 ms). Called after work that takes seconds (a long backward pass, a model load)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, looked up once (None: not glibc)."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
