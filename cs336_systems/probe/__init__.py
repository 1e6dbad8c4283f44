"""Why is *my* training slow? A probe for the user's own training loop.

    probe = StepProbe(device="cuda", output="probe.csv", batch_size=32)
    for batch in probe.loader(train_loader):      # times each wait for a batch
        with probe.phase("forward"):              # any names: time the loop's own phases
            loss = model(batch)
        ...
        probe.step()                              # closes a step

Per window of N steps: data-wait % (time blocked waiting for the next batch / wall time,
torchtitan's data_loading %), each phase's mean time, samples/s, and loader_bench's
input-bound verdict bands. One summary line per window (through tqdm.write when a tqdm bar is
active); rows go to CSV (flushed per window), JSONL (raw per-step times) and Markdown (with the
advice) through the project's writers. `close()` (or leaving `with StepProbe(...)`, or the
interpreter exiting) writes what was measured, also when the user's loop raised.

Timing: the host clock (time.perf_counter) for the waits and the steps. Phases: the host clock
on a CPU; on a GPU a CUDA event pair per phase, resolved after one synchronize at the end of the
window, so the host runs ahead of the GPU as in training (no synchronisation per step).
A step runs from the previous probe.step() (or the first wait) to this one, so steps tile time.
"""

from ..loader_bench import verdict
from .advice import LoaderInfo, compute_advice, host_advice, input_advice
from .core import DEFAULT_WINDOW, StepProbe
from .record import HOST_BOUND_BUSY_PCT, PROBE_FIELDS, ProbeRecord, Step, bound, window_figures

__all__ = [
    "DEFAULT_WINDOW",
    "HOST_BOUND_BUSY_PCT",
    "PROBE_FIELDS",
    "LoaderInfo",
    "ProbeRecord",
    "Step",
    "StepProbe",
    "bound",
    "compute_advice",
    "host_advice",
    "input_advice",
    "verdict",
    "window_figures",
]
