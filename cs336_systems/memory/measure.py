"""The memory of a running step, measured per phase: CUDA allocator counters or CPU RSS."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..device import libc

# -- measured --------------------------------------------------------------------------


def _rss_status(field_name: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field_name):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field_name} in /proc/self/status")


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def pin_mmap_threshold(threshold_bytes: int = 128 * 1024) -> bool:
    """Make glibc serve every allocation >= `threshold_bytes` with mmap and return it on free.

    By default glibc raises its mmap threshold after the first large free (up to 32 MiB),
    so activation-sized tensors come from the heap and stay resident after they are freed:
    RSS then exceeds live tensor memory (by ~27% for a d_model-1024 step here). Pinning the
    threshold (same as MALLOC_MMAP_THRESHOLD_=131072) makes RSS track live memory, at the
    price of page faults (~9% slower CPU steps here). Returns False where not glibc.
    """
    mallopt = getattr(libc(), "mallopt", None)
    return bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes)) if mallopt is not None else False


def current_memory_bytes(device: torch.device) -> int:
    """Allocated bytes on a CUDA device, resident set size of this process on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _rss_status("VmRSS:")


def baseline_memory_bytes(device: torch.device, configs) -> int:
    """Memory in use before the model is built, which a step's figures are measured from.

    On a CPU that is this process's RSS, so a module that a step imports on first use would count
    as the step's memory: torch._dynamo (73 MiB of modules here), which torch's optimizers,
    activation checkpointing and torch.compile import, is imported first when one of `configs`
    (BenchmarkConfigs) will.
    """
    if device.type == "cpu" and any(_step_imports_dynamo(config) for config in configs):
        import torch._dynamo  # noqa: F401
    return current_memory_bytes(device)


def _step_imports_dynamo(config) -> bool:
    return config.pass_type == "train-step" or bool(config.compile) or config.model.checkpoint_group_size > 0


def rss_high_water_mark_available() -> bool:
    try:
        _reset_rss_high_water_mark()
        _rss_status("VmHWM:")
    except OSError:
        return False
    return True


def _reset_rss_high_water_mark() -> None:
    # Linux: writing 5 to clear_refs resets VmHWM to the current RSS (O(1), ~5 us here).
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


class PhaseMemory:
    """Peak memory of each phase (forward, backward, optimizer) of every step.

    CUDA: the caching allocator's max allocated / reserved, reset at each phase start
    (host-side counters: no synchronisation, no effect on timing). CPU: the kernel's
    RSS high-water mark (VmHWM), reset through /proc/self/clear_refs at each phase start:
    exact, not sampled; it counts every page the process touched, allocator slack included.
    """

    def __init__(self, device: torch.device, step_starts_at_forward: bool = True):
        self.device = device
        # False: the caller marks steps (new_step), as a step of K micro-batches enters "forward" K times
        self.step_starts_at_forward = step_starts_at_forward
        self.steps: list[dict[str, tuple[int, int | None]]] = []
        self.measured_peak: tuple[int, int | None] | None = None
        self.source = "cuda_allocator" if device.type == "cuda" else "rss_high_water_mark"

    def _reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_rss_high_water_mark()

    def _peak(self) -> tuple[int, int | None]:
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)  # one call: it builds the whole dict
            return stats.get("allocated_bytes.all.peak", 0), stats.get("reserved_bytes.all.peak", 0)
        return _rss_status("VmHWM:"), None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The peak of one phase of a step (a phase entered again: the larger peak); a 'forward'
        phase starts a new step unless the caller marks steps."""
        if (name == "forward" and self.step_starts_at_forward) or not self.steps:
            self.steps.append({})
        self._reset()
        yield
        peak, earlier = self._peak(), self.steps[-1].get(name)
        if earlier is not None:
            reserved = [value for value in (peak[1], earlier[1]) if value is not None]
            peak = (max(peak[0], earlier[0]), max(reserved) if reserved else None)
        self.steps[-1][name] = peak

    def new_step(self) -> None:
        self.steps.append({})

    @contextlib.contextmanager
    def whole(self) -> Iterator[None]:
        """The peak over a span of steps (the measured ones), into `measured_peak`."""
        self._reset()
        yield
        self.measured_peak = self._peak()


def step_peak(step: dict[str, tuple[int, int | None]]) -> tuple[int, int | None]:
    allocated = max(value[0] for value in step.values())
    reserved = [value[1] for value in step.values() if value[1] is not None]
    return allocated, (max(reserved) if reserved else None)


def memory_columns(memory: PhaseMemory, baseline: int) -> dict[str, int | str | None]:
    """A benchmark row's memory columns: first step (optimizer state created) and steady state (the
    extra traced step), per phase.

    CUDA figures are the allocator's absolute counters; CPU figures are RSS minus the
    RSS before the model was built, and peak_memory_bytes is the RSS high-water mark
    over the measured steps.
    """
    offset = baseline if memory.source == "rss_high_water_mark" else 0
    first, steady = memory.steps[0], memory.steps[-1]

    def phase_peak(step: dict, name: str) -> int | None:
        return step[name][0] - offset if name in step else None

    first_allocated, first_reserved = step_peak(first)
    columns = dict(
        memory_source=memory.source,
        memory_baseline_bytes=baseline,
        forward_peak_bytes=phase_peak(steady, "forward"),
        backward_peak_bytes=phase_peak(steady, "backward"),
        optimizer_peak_bytes=phase_peak(steady, "optimizer"),
        first_forward_peak_bytes=phase_peak(first, "forward"),
        first_backward_peak_bytes=phase_peak(first, "backward"),
        first_optimizer_peak_bytes=phase_peak(first, "optimizer"),
        first_step_peak_bytes=first_allocated - offset,
        first_step_reserved_bytes=first_reserved,
    )
    if memory.source == "cuda_allocator":
        # A CUDA-graph replay allocates nothing: its footprint is the capture's peak (graph pool included).
        capture = first.get("capture")
        columns["peak_memory_bytes"], columns["peak_reserved_bytes"] = (
            capture if capture is not None else step_peak(steady)
        )
    else:
        columns["peak_memory_bytes"] = memory.measured_peak[0] - offset
    return columns


def tensor_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's parameters and buffers."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


@contextlib.contextmanager
def cuda_memory_history(path: str | None, device: torch.device) -> Iterator[None]:
    """Record the CUDA allocator's history (for pytorch.org/memory_viz) and dump it to `path`."""
    if path is None:
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, device=device)
    try:
        yield
    finally:
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None, device=device)
