"""Resource monitor: GPU, CPU, memory, network and disk of a run, sampled on one clock.

    python -m cs336_systems.monitor --monitor-interval 0.5 --output run.csv -- python train.py --epochs 1

runs the command, samples every --monitor-interval seconds (alias --interval) until it exits, writes the time series
(run.csv), one panel per metric over time (run.png) and a record of the run (run.json:
command, exit status, environment, summary), prints mean / p50 / p90 / max of each
metric on stderr and exits with the command's exit status. In Python, wrap any code:

    with monitored("run.csv", interval=0.5):
        train()

What each column is (all sampled at the same instant `t_s` of one clock):
  gpu_util_pct            NVML utilisation: % of the driver's last sample period (1/6 s to 1 s)
                          in which any kernel ran; not SM occupancy. Mean over monitored GPUs.
  gpu_memory_used_bytes   NVML device memory in use, all processes, summed over monitored GPUs.
                          Without a GPU or an NVML driver both stay empty and the output says so.
  system_cpu_pct          busy CPU time of the whole machine, % of all cores (psutil.cpu_times deltas).
  tree_cpu_pct            CPU time of the command's process tree, % of all cores (100 = every core busy);
                          children that exited and were waited for are included.
  tree_rss_bytes          sum of the resident set sizes of the tree's live processes; pages shared by
                          forked processes (DataLoader workers) are counted once per process.
  tree_processes          number of live processes in the tree.
  system_ram_used_bytes   total - available (what the kernel could not give to a new program).
  net_recv/sent_bytes_per_s, disk_read/write_bytes_per_s
                          machine-wide rates over the last interval (loopback included, so a local
                          HTTP server's traffic shows).
Rates and CPU percentages cover the interval that ends at `t_s`.
Modules: sampling (Sample, GpuProbe, ResourceMonitor), files (CSV, plot, the run's JSON
record, `monitored`, the --monitor flags every command shares), cli.
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
    "DEFAULT_INTERVAL_S", "METRICS", "PANELS", "PROG", "SAMPLE_FIELDS", "GpuProbe", "MonitorPathError",
    "MonitorReport", "ResourceMonitor", "Sample", "SampleCsvWriter", "add_monitor_arguments",
    "check_monitor_arguments", "check_monitor_path", "exit_status", "main", "monitored", "plot_samples",
    "process_tree", "report_text", "run_monitored", "summarize_samples", "summary_table", "total_rss_bytes",
    "tree_cpu_seconds", "write_report",
]  # fmt: skip
