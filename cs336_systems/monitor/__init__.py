"""GPU, CPU, memory, network and disk of a run, sampled on one clock.

  sampling.py  Sample, GpuProbe, ResourceMonitor
  files.py     CSV, plot, the run's JSON record, `monitored`, the --monitor flags every command shares
  cli.py       cs336-bench monitor

What each column is: docs/pipelines.md; the flags: --help.
"""

from .cli import PROG, exit_status, main, run_monitored
from .files import (
    MonitorPathError,
    MonitorReport,
    SampleCsvWriter,
    add_monitor_arguments,
    check_monitor_arguments,
    check_monitor_path,
    monitored,
    plot_samples,
    report_text,
    summarize_samples,
    summary_table,
    write_report,
)
from .sampling import (
    DEFAULT_INTERVAL_S,
    METRICS,
    PANELS,
    SAMPLE_FIELDS,
    GpuProbe,
    ResourceMonitor,
    Sample,
    process_tree,
    total_rss_bytes,
    tree_cpu_seconds,
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "METRICS",
    "PANELS",
    "PROG",
    "SAMPLE_FIELDS",
    "GpuProbe",
    "MonitorPathError",
    "MonitorReport",
    "ResourceMonitor",
    "Sample",
    "SampleCsvWriter",
    "add_monitor_arguments",
    "check_monitor_arguments",
    "check_monitor_path",
    "exit_status",
    "main",
    "monitored",
    "plot_samples",
    "process_tree",
    "report_text",
    "run_monitored",
    "summarize_samples",
    "summary_table",
    "total_rss_bytes",
    "tree_cpu_seconds",
    "write_report",
]
