"""Every row names the tool that wrote it: a `tool` column, first. The tools whose rows are records
(results/records.py and each tool's record.py) declare their name and identity there; the tools that
write rows of their own below, with the fields that tell two of their rows apart.

A file written before the `tool` column existed is read as today's (readers.as_todays_rows): its
tool is told from the columns it has (`LEGACY`), the first match winning. Nsight Systems' own kernel
summary (`nsys stats`) never names itself, so it is always told that way.
"""

from __future__ import annotations

from collections.abc import Iterable

TOOL = "tool"

# tool -> the fields that tell two of its rows apart, for the tools that write rows of their own (and
# the probe, whose record marks none: its windows are told apart by run and window)
ROW_IDENTITY: dict[str, tuple[str, ...]] = {
    "probe": ("source", "run", "window"),
    "warmup_study": ("model", "warmup_steps", "step_index", "measured", "device_name"),
    "handout": ("problem", "step"),
    "handout_checklist": ("problem",),
    "find_max": ("source", "dimension"),
    "mixed_precision": ("table", "experiment", "tensor", "device", "device_name"),
    "nsys_kernels": ("Name",),
    "memory_allocations": ("rank",),
    "residuals": ("rank", "model", "context_length", "batch_size", "precision", "device_name"),
}

# tool -> columns a file of it had before the `tool` column (ddp_bench before benchmark: both have model_size)
LEGACY: dict[str, tuple[str, ...]] = {
    "handout": ("problem", "step", "plan_status", "outcome"),
    "mixed_precision": ("table", "experiment", "accumulator", "result"),
    "nsys_kernels": ("Time (%)", "Total Time (ns)", "Instances", "Name"),
    "memory_allocations": ("rank", "size_bytes", "event_index", "user_frame"),
    "residuals": ("rank", "module", "op", "share_pct"),
    "warmup_study": ("warmup_steps", "step_index", "step_ms"),
    "monitor": ("t_s", "system_cpu_pct", "tree_cpu_pct"),
    "monitor_run": ("command", "exit_status", "interval_s", "num_samples"),
    "probe": ("window", "step_ms", "data_wait_pct", "verdict"),
    "find_max": ("dimension", "largest_ok", "smallest_oom"),
    "attention_bench": ("implementation", "head_dim", "context_length", "status"),
    "allreduce_bench": ("size_bytes", "world_size", "mean_ms", "status"),
    "ddp_bench": ("strategy", "world_size", "mean_ms", "status"),
    "loader_bench": ("storage", "num_workers", "samples_per_s", "status"),
    "benchmark": ("model_size", "pass_type", "mean_ms", "status"),
}
TOOL_NAMES = (*LEGACY, "handout_checklist")  # and the tools that always named themselves


def legacy_tool(columns: Iterable[str]) -> str | None:
    """The tool of a file written before the `tool` column, from its columns (None: no tool of ours)."""
    present = set(columns)
    return next((tool for tool, needed in LEGACY.items() if set(needed) <= present), None)


def named(tool: str, rows: Iterable[dict]) -> list[dict]:
    """`rows` with the tool's name as their first column (a writer of rows of its own)."""
    return [{TOOL: tool, **{k: v for k, v in row.items() if k != TOOL}} for row in rows]
