"""Why is *my* training slow? StepProbe, a probe for the user's own training loop.

  core.py    StepProbe: the loader wrapper, phases, windows, writing
  record.py  ProbeRecord and its Markdown view
  advice.py  what to try, from loader_bench's closed forms and the memory estimator

How to use it, its columns and its own cost: docs/pipelines.md.
"""

from ..loader_bench import verdict
from .advice import LoaderInfo, compute_advice, host_advice, input_advice
from .core import DEFAULT_WINDOW, StepProbe
from .record import HOST_BOUND_BUSY_PCT, ProbeRecord, Step, bound, window_figures

__all__ = [
    "DEFAULT_WINDOW",
    "HOST_BOUND_BUSY_PCT",
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
