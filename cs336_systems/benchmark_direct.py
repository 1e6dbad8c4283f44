"""python -m cs336_systems.benchmark_direct: a grid of configurations in this one process.

No process start-up per configuration: each model is built once per (size, shape,
attention) and reused for every precision, context, batch and pass type after it in the
grid, then freed before the next. An out-of-memory is a row; memory is released and the
sweep goes on. For configurations that may crash or hang, use run_benchmarks.

Example:
    cs336-bench benchmark_direct --model-sizes small medium --context-lengths 128 256 \
        --precisions fp32 bf16 --pass-types forward forward-backward --output results/sweep.csv
"""

from __future__ import annotations

import contextlib
import itertools

from . import process_state, sweep_jobs
from .child import failed_record
from .command import Command
from .device import failure_status, release_memory, resolve_device
from .factory import build_model, count_parameters_for
from .memory import baseline_memory_bytes
from .runner import run_benchmark
from .sweep import sweep_command
from .tools import prog
from .user_model import ModelFactoryError, check_model_output
from .usercode import UserCodeError, UserCodeTimeout, guarded

PROG = prog("benchmark_direct")


def execute(pending, args, env, writer, limits=None) -> None:
    """Each model once for its group of configurations, in this process (no children: `limits` is None)."""
    for model_config, group in itertools.groupby(pending, key=lambda config: config.model):
        group = list(group)
        device = resolve_device(group[0].device)
        release_memory(device)
        baseline = baseline_memory_bytes(device, group)
        model, failure, changed = None, None, {}
        label = f"--model-factory {args.model_factory}" if args.model_factory else "building the model"
        try:
            with guarded(label, changed=changed):
                model = build_model(model_config, device, args.model_factory)
                if args.model_factory:
                    check_model_output(model, model_config, device, label)
            if error := process_state.verdict(changed, label)[0]:  # e.g. a float64 default dtype built the model
                failure = ("wrong", error)
        except ModelFactoryError as exc:
            failure = ("error", str(exc))
        except Exception as exc:  # building can fail like a step can
            failure = failure_status(exc)
        num_params = None
        if failure is not None:
            with contextlib.suppress(UserCodeError, UserCodeTimeout), guarded("counting parameters"):
                num_params = count_parameters_for(model_config, args.model_factory)
        for config in group:
            if not writer.start(config):
                break
            if failure is not None:
                writer.write(failed_record(config, env, *failure, num_params))
            else:
                writer.write(run_benchmark(config, model=model, environment=env, memory_baseline_bytes=baseline))
        model = None
        release_memory(device)
        if writer.stop.requested:
            return


build_parser, run = sweep_command(PROG, __doc__.split("\n")[0], execute, child_processes=False, run_jobs=sweep_jobs.run)
main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
