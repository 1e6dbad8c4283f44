"""Run a module under an address-space cap so allocations fail for real (CPU only).

    python -m cs336_systems.memory_cap HEADROOM_BYTES module [args...]

torch is imported first; the cap is then set at the address space mapped so far plus
HEADROOM_BYTES (RLIMIT_AS), so the headroom is what the benchmark itself may allocate.
An allocation past it fails inside torch ("DefaultCPUAllocator: can't allocate memory")
and becomes an 'oom' row. CUDA needs far more address space than it uses: CPU only.
"""

from __future__ import annotations

import contextlib
import importlib
import resource
import runpy
import sys
from collections.abc import Iterator

import torch  # noqa: F401  (mapped before the cap: the libraries are not what we measure)


def address_space_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def cap_address_space(headroom_bytes: int) -> None:
    limit = address_space_bytes() + headroom_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@contextlib.contextmanager
def soft_address_space_cap(headroom_bytes: int) -> Iterator[int]:
    """Lower the *soft* RLIMIT_AS to the address space mapped now plus `headroom_bytes`
    for the duration of the block, then restore it (a soft limit can be raised back up to
    the hard one). Yields the limit set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = address_space_bytes() + headroom_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, soft)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def main() -> None:
    headroom, module, *args = sys.argv[1:]
    # the module to run, and all it imports, mapped before the cap: its libraries are not what we measure
    importlib.import_module(module)

    cap_address_space(int(headroom))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
