"""python -m cs336_systems.loader_bench: is training waiting for its data?

Feeds a real torch.utils.data.DataLoader into a real training step and measures, for
each step, the time the training loop is blocked in next(iterator) (data wait), the
host-to-device copy and the compute, then per epoch: samples/s, data-wait %,
compute-idle % and a verdict. Sweeps the loader's flags and recommends the fastest
combination whose predicted host-RAM buffer fits --ram-budget.

Examples:
    python -m cs336_systems.loader_bench --storage simulated --latency-ms 10 --batch-size 8 \\
        --compute-ms 20 --num-workers 0 1 2 4 8 --epochs 2 --output results/loader.csv
    python -m cs336_systems.loader_bench --storage http --latency-ms 50 --bandwidth 20MB \\
        --batch-size 1 --num-workers 0 --processes 1 3
    python -m cs336_systems.loader_bench --dataset my_pkg.data:make_dataset --compute-ms 100

Definitions (per epoch):
  data_wait_pct     100 * time blocked in next(iterator) / epoch wall time (torchtitan's data_loading %)
  compute_idle_pct  100 * (1 - compute time / wall time) (1 - MLPerf Storage's accelerator utilisation)
  verdict           TensorFlow's input-pipeline bands on data_wait_pct: < 5 not input-bound,
                    5-20 moderately input-bound, > 20 input-bound
  predicted_buffer_bytes  batches in flight (num_workers * prefetch_factor; 1 when num_workers is 0)
                    plus the one the training step holds, times the batch bytes; with pin_memory
                    in effect each in-flight batch may also have its page-locked copy
Timing: host clock (time.perf_counter) for the wait and the epoch; the copy and the compute
with the same host clock on CPU, and with CUDA event pairs on GPU, read after one
synchronize at the end of the epoch so the host can run ahead of the GPU as in training.
The epoch's wall time is read after that synchronize.

Modules: predictions (verdict bands, closed forms), config, data, step, workers (their memory),
measure (epochs in one or N processes), record (LoaderRecord and its view), recommend, cli.
"""

from .cli import PROG, bench_from_args, build_parser, main, prepared_storage, progress_line
from .config import (
    COMPUTE_KINDS,
    LOADER_FLAGS,
    BenchConfig,
    DatasetError,
    LoaderConfig,
    load_dataset,
    loader_grid,
)
from .data import EpochSampler, StoreDataset, batch_nbytes, make_loader, to_device
from .measure import (
    CHILD_TIMEOUT_S,
    EpochMeasurement,
    error_text,
    run_configuration,
    run_epochs,
    run_processes,
)
from .predictions import (
    INPUT_BOUND_PCT,
    NOT_INPUT_BOUND_PCT,
    predicted_buffer_bytes,
    predicted_epoch_s,
    predicted_samples_per_s,
    verdict,
)
from .recommend import Recommendation, recommend, recommendation_text
from .record import (
    LABEL_COLUMNS,
    LOADER_FIELDS,
    MARKDOWN_COLUMNS,
    TITLE,
    LoaderRecord,
    configuration_notes,
    epoch_record,
    new_record,
    records_for,
    render,
)
from .step import (
    TINY_MODEL_MAX_CONTEXT,
    PhaseTimer,
    compute_description,
    cuda_sleep_cycles_per_ms,
    make_compute,
    tiny_model_config,
)
from .workers import MEMORY_SAMPLE_INTERVAL_S, WorkerMemorySampler

__all__ = [
    "CHILD_TIMEOUT_S", "COMPUTE_KINDS", "INPUT_BOUND_PCT", "LABEL_COLUMNS", "LOADER_FIELDS", "LOADER_FLAGS",
    "MARKDOWN_COLUMNS", "MEMORY_SAMPLE_INTERVAL_S", "NOT_INPUT_BOUND_PCT", "PROG", "TINY_MODEL_MAX_CONTEXT",
    "TITLE", "BenchConfig", "DatasetError", "EpochMeasurement", "EpochSampler", "LoaderConfig", "LoaderRecord",
    "PhaseTimer", "Recommendation", "StoreDataset", "WorkerMemorySampler", "batch_nbytes", "bench_from_args",
    "build_parser", "compute_description", "configuration_notes", "cuda_sleep_cycles_per_ms", "epoch_record",
    "error_text", "load_dataset", "loader_grid", "main", "make_compute", "make_loader", "new_record",
    "predicted_buffer_bytes", "predicted_epoch_s", "predicted_samples_per_s", "prepared_storage", "progress_line",
    "recommend", "recommendation_text", "records_for", "render", "run_configuration", "run_epochs",
    "run_processes", "tiny_model_config", "to_device", "verdict",
]  # fmt: skip
