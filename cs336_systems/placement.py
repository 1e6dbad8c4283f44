"""Where a process runs: the executor that started it, its Slurm job, the node's GPU. torch-free.

Every row's environment carries these columns (results.environment.Environment); the executors
(cs336_systems.executor) set EXECUTOR_ENV in the processes they start, and Slurm sets its own variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Set by an executor in the processes it starts: local or slurm; unset is inline.
EXECUTOR_ENV = "CS336_BENCH_EXECUTOR"
PLACEMENT_FIELDS = ("executor", "slurm_job_id", "slurm_array_task_id", "gpu_id")


def slurm_job(environ: Mapping[str, str] | None = None) -> tuple[str | None, int | None]:
    """(job id, array task) of the Slurm job this process runs in: an array task is `ARRAYJOB_TASK`, as
    squeue and scancel name it; (None, None) outside Slurm."""
    env = os.environ if environ is None else environ
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}", int(array_task) if array_task.isdigit() else None
    return env.get("SLURM_JOB_ID") or None, None


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The node's GPUs this process may use, as physical indices: Slurm's allocation (SLURM_STEP_GPUS,
    SLURM_JOB_GPUS) when set, else CUDA_VISIBLE_DEVICES; empty when neither says."""
    env = os.environ if environ is None else environ
    text = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    return [part.strip() for part in text.split(",") if part.strip()]


def placement(
    device_type: str | None, device_index: int | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The placement columns of a row measured on `device_type`:`device_index` by this process: the GPU is
    the physical index the visible list maps the device's index to (None on a CPU)."""
    env = os.environ if environ is None else environ
    job, task = slurm_job(env)
    gpu = None
    if device_type == "cuda":
        index = device_index or 0
        listed = visible_gpus(env)
        gpu = listed[index] if index < len(listed) else str(index)
    return {
        "executor": env.get(EXECUTOR_ENV) or "inline",
        "slurm_job_id": job,
        "slurm_array_task_id": task,
        "gpu_id": gpu,
    }
