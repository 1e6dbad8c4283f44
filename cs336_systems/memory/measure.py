"""The memory of a running step, measured per phase: CUDA allocator counters or CPU RSS, or tensors by kind."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

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


# -- tensors by what they hold (torch's MemTracker): every storage made while it is on, an FSDP2 DTensor as
# its local shard, a storage FSDP resizes to nothing as nothing; counted from zero, so one process and every
# rank share one baseline (a resident set starts at the few hundred MB torch takes). Its Python dispatch slows
# a step: measured in steps of their own, never the timed ones.

# MemTracker's name for what a tensor holds -> ours (a row's breakdown, its table's columns)
CATEGORIES = dict(Parameter="parameters", Gradient="gradients", Optstate="optimizer_state", Activation="activations")
CATEGORIES.update(Temp="temporaries", Buffer="buffers", Other="other")
# the handout's three moments (optimizer_state_sharding_accounting (a)); make_step's phases end in them
BUILT, BEFORE_STEP, AFTER_STEP = PHASES = ("after building", "before optimizer step", "after optimizer step")
STEP_SPANS = {"forward": BEFORE_STEP, "backward": BEFORE_STEP, "optimizer": AFTER_STEP}


class TensorMemory:
    """`with memory.phase(BUILT): build()`, `memory.built(model)`, then steps with `memory.phase` as
    make_step's phase callback (forward and backward one span: the peak before the optimizer step).
    `peaks[phase]`: each category's bytes at the phase's peak, and their `total` (the larger peak of
    a phase run again)."""

    def __init__(self, device: torch.device):
        from torch.distributed._tools.mem_tracker import MemTracker

        self.tracker, self.device, self.on = MemTracker(), device, True  # off: phase() does nothing
        self.peaks: dict[str, dict[str, int]] = {}
        self._open = contextlib.ExitStack()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        if name == "forward":
            self.tracker.reset_mod_stats()  # a new step: else the tracker refuses the model's second forward
        if name != "backward":  # backward goes on in the span its forward opened
            self._open.enter_context(self.tracker)  # entering starts a new peak from what is held now
        try:
            yield
        except BaseException:
            self._open.close()
            raise
        if name != "forward":
            self._open.close()
            peak = self._breakdown(self.tracker.get_tracker_snapshot("peak"))
            span = STEP_SPANS.get(name, name)
            if peak["total"] >= self.peaks.get(span, {}).get("total", -1):
                self.peaks[span] = peak

    def built(self, model: nn.Module) -> None:
        """Label what building left: the model's parameters and buffers, and the rest it holds (a student's
        unregistered copy of the weights, DDP's buckets, the batch) as other, not activations; the phase's
        peak above what is held now was temporary."""
        from torch.distributed._tools.mem_tracker import _MemRefType, _UpdateType

        self.tracker.track_external(model)
        for winfo, _ in list(self.tracker._WINFO.values()):  # no public way to relabel a storage
            if winfo.reftype in (_MemRefType.ACT, _MemRefType.TEMP):
                old, winfo.reftype = winfo.reftype, _MemRefType.OTH
                self.tracker._update_snap(_UpdateType.REF, winfo, old_reftype=old)
        held = self._breakdown(self.tracker.get_tracker_snapshot("current"))
        peak = max(self.peaks.get(BUILT, {}).get("total", 0), held["total"])
        self.peaks[BUILT] = {**held, "temporaries": held["temporaries"] + peak - held["total"], "total": peak}

    def _breakdown(self, snapshot: dict) -> dict[str, int]:
        device = snapshot.get(self.device) or {}
        shown = {ours: int(device.get(theirs, 0)) for theirs, ours in CATEGORIES.items()}
        return {**shown, "total": sum(shown.values())}


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
