"""python -m cs336_systems.loader_bench: is training waiting for its data?

  predictions.py  verdict bands, the closed forms of an epoch and of the host-RAM buffer
  config.py       LoaderConfig
  data.py         the datasets (simulated, local, http, or a user's)
  step.py         the training step fed (a stand-in or a tiny model)
  workers.py      the workers' memory
  measure.py      epochs in one or N processes
  record.py       LoaderRecord and its Markdown view
  recommend.py    the fastest combination whose buffer fits --ram-budget
  cli.py          the flags and main

The columns, the closed form and the stories: docs/pipelines.md; the flags: --help.
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
    "CHILD_TIMEOUT_S",
    "COMPUTE_KINDS",
    "INPUT_BOUND_PCT",
    "LOADER_FLAGS",
    "MEMORY_SAMPLE_INTERVAL_S",
    "NOT_INPUT_BOUND_PCT",
    "PROG",
    "TINY_MODEL_MAX_CONTEXT",
    "TITLE",
    "BenchConfig",
    "DatasetError",
    "EpochMeasurement",
    "EpochSampler",
    "LoaderConfig",
    "LoaderRecord",
    "PhaseTimer",
    "Recommendation",
    "StoreDataset",
    "WorkerMemorySampler",
    "batch_nbytes",
    "bench_from_args",
    "build_parser",
    "compute_description",
    "configuration_notes",
    "cuda_sleep_cycles_per_ms",
    "epoch_record",
    "error_text",
    "load_dataset",
    "loader_grid",
    "main",
    "make_compute",
    "make_loader",
    "new_record",
    "predicted_buffer_bytes",
    "predicted_epoch_s",
    "predicted_samples_per_s",
    "prepared_storage",
    "progress_line",
    "recommend",
    "recommendation_text",
    "records_for",
    "render",
    "run_configuration",
    "run_epochs",
    "run_processes",
    "tiny_model_config",
    "to_device",
    "verdict",
]
