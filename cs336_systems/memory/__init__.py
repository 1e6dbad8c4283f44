"""memory needed by a configuration: predicted before a run, measured per phase during it.

The command line is cs336_systems.memory.cli (`python -m cs336_systems.memory`); it is
not imported here, so importing the estimator never imports a CLI.
"""

from .estimate import MemoryEstimate, estimate_config, estimate_memory, find_max_by_prediction
from .measure import (
    PhaseMemory,
    baseline_memory_bytes,
    cuda_memory_history,
    current_memory_bytes,
    memory_columns,
    pin_mmap_threshold,
    rss_high_water_mark_available,
    step_peak,
    tensor_bytes,
)

__all__ = [
    "MemoryEstimate",
    "PhaseMemory",
    "baseline_memory_bytes",
    "cuda_memory_history",
    "current_memory_bytes",
    "estimate_config",
    "estimate_memory",
    "find_max_by_prediction",
    "memory_columns",
    "pin_mmap_threshold",
    "rss_high_water_mark_available",
    "step_peak",
    "tensor_bytes",
]
