"""What each rank runs for one all-reduce size."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..device import first_line, is_out_of_memory, release_memory
from ..distributed import BarrierFirst, RankContext
from ..memory_cap import cap_address_space
from ..timing import HostTimer, device_synchronizer, time_steps
from ..units import parse_bytes

DTYPE = torch.float32
BYTES_PER_ELEMENT = 4


def parse_size(text: str) -> tuple[str, int]:
    """'10MB' -> ('10MB', 10_000_000): at least one float32 element, whole elements."""
    try:
        size_bytes = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size_bytes < BYTES_PER_ELEMENT:
        raise argparse.ArgumentTypeError(f"{text}: smaller than one float32 element ({BYTES_PER_ELEMENT} bytes)")
    return text, size_bytes


@dataclass(frozen=True)
class AllReduceUnit:
    size: str
    size_bytes: int
    warmup_steps: int
    measure_steps: int
    memory_limit_bytes: int | None = None  # CPU: address space each rank may still map


def allreduce_worker(ctx: RankContext, unit: AllReduceUnit) -> dict:
    """This rank's part of one size: {'status', 'error', 'warmup_ms', 'measured_ms'}."""
    if unit.memory_limit_bytes is not None:
        _cap_once(unit.memory_limit_bytes)
    tensor, error = None, None
    try:
        # filled (not torch.empty) so the pages are really allocated, on every rank
        tensor = torch.full(
            (unit.size_bytes // BYTES_PER_ELEMENT,), float(ctx.rank + 1), dtype=DTYPE, device=ctx.device
        )
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        error = first_line(exc)
    # Every rank learns whether all of them got their tensor, so none waits in an
    # all-reduce that another will never join.
    allocated = torch.tensor([0 if tensor is None else 1], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(allocated, op=dist.ReduceOp.MIN)
    if not allocated.item():
        tensor = None
        release_memory(ctx.device)
        return {"status": "oom", "error": error or "another rank could not allocate its tensor"}

    def step() -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    step()  # untimed: every element must now be 1 + 2 + ... + n
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    if not bool((tensor == expected).all()):
        return {"status": "error", "error": f"all_reduce returned wrong values (expected every element = {expected:g})"}
    # Later steps keep summing in place; the values (growing, at most inf) do not change the speed.
    timer = BarrierFirst(HostTimer(synchronize=device_synchronizer(ctx.device)), ctx.barrier)
    times = time_steps(step, warmup_steps=unit.warmup_steps, measure_steps=unit.measure_steps, timer=timer)
    tensor = None
    release_memory(ctx.device)
    return {"status": "ok", "error": None, "warmup_ms": list(times.warmup_ms), "measured_ms": list(times.measured_ms)}


@functools.cache
def _cap_once(headroom_bytes: int) -> None:
    """The cap is set once per rank, after it joined the group (a cap cannot be raised again)."""
    cap_address_space(headroom_bytes)
