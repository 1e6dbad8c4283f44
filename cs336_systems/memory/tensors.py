"""The bytes a process's tensors hold in each phase of a training step, by what they hold: torch's own
tracker (torch.distributed._tools.mem_tracker.MemTracker), which sees every storage made while it is
on, an FSDP2 DTensor as its local shard, and a storage FSDP resizes to nothing as nothing.

Counted from zero, so one process and every rank share one baseline (a process's resident set starts
at the few hundred MB torch itself takes, which hides a few MiB of model). What is made while it is
off is not counted: a step's memory is measured in steps of its own, never the timed ones (the
tracker's Python dispatch would slow them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

# MemTracker's names for what a tensor holds, and ours (a row's breakdown, its table's columns)
CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "other",
}
# the handout's three moments (optimizer_state_sharding_accounting (a)); make_step's phases end in them
BUILT, BEFORE_STEP, AFTER_STEP = "after building", "before optimizer step", "after optimizer step"
PHASES = (BUILT, BEFORE_STEP, AFTER_STEP)
STEP_SPANS = {"forward": BEFORE_STEP, "backward": BEFORE_STEP, "optimizer": AFTER_STEP}


class TensorMemory:
    """Per phase, the tensors' bytes at their peak, by category: `with memory.phase(BUILT): build()`,
    `memory.built(model)`, then steps with `memory.phase` as make_step's phase callback (a step's
    forward and backward are one span: the peak before the optimizer step). `peaks[phase]` holds each
    category's bytes at the phase's peak and their `total`; repeated phases keep the larger peak."""

    def __init__(self, device: torch.device):
        from torch.distributed._tools.mem_tracker import MemTracker

        self.tracker, self.device = MemTracker(), device
        self.peaks: dict[str, dict[str, int]] = {}
        self.on = True  # off: phase() does nothing (the timed steps)
        self._open = contextlib.ExitStack()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        span = STEP_SPANS.get(name, name)
        if name == "forward":
            self.tracker.reset_mod_stats()  # a new step: else the tracker refuses the model's second forward
        if name != "backward":  # backward continues the span its forward opened
            self._open.enter_context(self.tracker)  # entering it starts a new peak from what is held now
        try:
            yield
        except BaseException:
            self._open.close()
            raise
        if name != "forward":
            self._open.close()
            self._keep(span, self.tracker.get_tracker_snapshot("peak"))

    def built(self, model: nn.Module) -> None:
        """Label what building left: the model's parameters and buffers; anything else still alive (a
        student's unregistered full copy of the weights, DDP's buckets, the step's batch) is held, not an
        activation. The phase's peak above what is held now was temporary."""
        from torch.distributed._tools.mem_tracker import _MemRefType, _UpdateType

        self.tracker.track_external(model)
        for winfo, _ in list(self.tracker._WINFO.values()):  # no public way to relabel a storage
            if winfo.reftype in (_MemRefType.ACT, _MemRefType.TEMP):
                old, winfo.reftype = winfo.reftype, _MemRefType.OTH
                self.tracker._update_snap(_UpdateType.REF, winfo, old_reftype=old)
        held = self._breakdown(self.tracker.get_tracker_snapshot("current"))
        peak = self.peaks.get(BUILT, {}).get("total", held["total"])
        held["temporaries"] += max(0, peak - held["total"])
        held["total"] = max(peak, held["total"])
        self.peaks[BUILT] = held

    def _breakdown(self, snapshot: dict) -> dict[str, int]:
        device = snapshot.get(self.device) or {}
        shown = {ours: int(device.get(theirs, 0)) for theirs, ours in CATEGORIES.items()}
        return {**shown, "total": sum(shown.values())}

    def _keep(self, span: str, snapshot: dict) -> None:
        breakdown = self._breakdown(snapshot)
        if breakdown["total"] >= self.peaks.get(span, {}).get("total", -1):
            self.peaks[span] = breakdown
