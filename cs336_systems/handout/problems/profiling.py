"""The handout's profiling problems: nsys_profile (Nsight Systems on a GPU with nsys, else the torch
profiler's kernel table from a benchmark sweep) and memory_profiling (peaks, memory snapshots drawn as
active-memory timelines, what autograd saves per block)."""

from __future__ import annotations

from ...tools import module_name
from ..parameters import Options
from ..plan import SWEEP, Step, fit_verdict, model_configs, predicted_peak
from ..target import Target
from .model import MEMORY_SWEEP, SCRIPTS, memory_options, model_flags, sizes, sweep, training_optimizer, worst_peak

NSYS_REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum", "nvtx_kern_sum")  # the CSVs scripts/nsys_profile.sh writes
PROFILED_PASSES = ("forward", "train-step")  # inference for (a)-(c), (e); the training step for (d)


def builtin_train_step_peak(options: Options, target: Target, size: str, context: int) -> int:
    """The estimator's peak of one training step of the built-in model (a student's model is the same
    architecture), naive attention as the handout's model has, at the scale's batch."""
    flags = {
        **model_flags(options, size),
        "--context-lengths": [context],
        "--batch-sizes": [options.scale.batch],
        "--pass-types": ["train-step"],
        "--attentions": ["naive"],
    }
    return max(predicted_peak(target, config) for config in model_configs(SWEEP, flags))


def nsys_configurations(options: Options, target: Target) -> list[tuple[str, list[int], str | None]]:
    """(size, contexts, why not) to profile. 2025: every size at the scale's contexts. 2026: two sizes,
    each at three powers of two above 128 (nsys_above), the largest the longest whose training step the
    estimator says fits; a size where none fits keeps the smallest, with the reason it is skipped."""
    scale = options.scale
    if scale.nsys_sizes[options.edition] is None:
        return [(size, list(scale.contexts), None) for size in sizes(options)]
    configurations = []
    for size in scale.sizes or scale.nsys_sizes[options.edition]:
        candidates, context = [], 2 * scale.nsys_above
        while context <= scale.nsys_max_context:
            candidates.append(context)
            context *= 2
        peaks = {t: builtin_train_step_peak(options, target, size, t) for t in candidates}
        fitting = [t for t in candidates if fit_verdict(peaks[t], target)[0] != "no"]
        if fitting:
            longest = max(fitting)
            contexts = [t for t in (longest // 4, longest // 2, longest) if t > scale.nsys_above]
            configurations.append((size, contexts, None))
        else:
            smallest = candidates[0]
            why = f"no context above {scale.nsys_above} fits: at {smallest}, {fit_verdict(peaks[smallest], target)[1]}"
            configurations.append((size, [smallest], why))
    return configurations


def nsys_profile(options: Options, target: Target) -> list[Step]:
    optimizer, optimizer_name, optimizer_note = training_optimizer(options)
    under_nsys = target.type == "cuda" and (target.nsys or target.assumed)
    steps = []
    for size, contexts, why_not in nsys_configurations(options, target):
        if under_nsys:
            new = [
                _nsys_step(options, size, context, pass_type, optimizer, optimizer_name)
                for context in contexts
                for pass_type in PROFILED_PASSES
            ]
        else:
            new = _torch_profiler_sweep(options, target, size, contexts, optimizer, optimizer_name)
        for step in new:
            if why_not:
                step.skip(why_not)
            if optimizer_note and "train-step" in str(step.flags.get("--pass-types", step.flags.get("--pass-type"))):
                step.reductions.append(optimizer_note)
            if options.edition == "2026" and len(contexts) < 3 and not why_not:
                step.reductions.append(f"only {len(contexts)} powers of two above {options.scale.nsys_above} fit")
        steps += new
    return steps


def _nsys_step(options: Options, size: str, context: int, pass_type: str, optimizer, optimizer_name: str) -> Step:
    name = f"nsys_profile-{size}-{context}-{pass_type}".replace(".", "_")
    what = "(a-c, e) forward" if pass_type == "forward" else f"(d) training step with {optimizer_name}"
    flags = {
        "_stem": name,
        **model_flags(options, size),
        "--context-length": context,
        "--batch-size": options.scale.batch,
        "--pass-type": pass_type,
        "--attention": "naive",  # the handout's model: softmax and the two matmuls are kernels of their own (e)
        "--device": options.device,
    }
    flags["--model-size"] = flags.pop("--model-sizes")[0]
    if pass_type == "train-step" and optimizer:
        flags["--optimizer"] = optimizer
    flags["_writes"] = [f"{name}.nsys-rep", *(f"{name}_{report}.csv" for report in NSYS_REPORTS)]
    step = Step(
        name,
        "nsys_profile",
        f"{what} under Nsight Systems: {size}, context {context}",
        str(SCRIPTS / "nsys_profile.sh"),
        flags,
        kind="benchmark",
        reads=tuple(f"{name}_{report}.csv" for report in NSYS_REPORTS),
        flags_of=module_name("benchmark"),  # the script runs benchmark with them
    )
    return step


def _torch_profiler_sweep(
    options: Options, target: Target, size: str, contexts: list[int], optimizer, optimizer_name: str
) -> list[Step]:
    """Where nsys or a GPU is absent: the same configurations as a sweep whose profiled step (the torch
    profiler, after the measured ones) gives each row its top kernels (JSONL's top_kernels)."""
    why = "no GPU" if target.type != "cuda" else "nsys is not on PATH"
    flags = {
        "--context-lengths": contexts,
        "--pass-types": list(PROFILED_PASSES),
        "--precisions": ["fp32"],
        "--attentions": ["naive"],
    }
    if optimizer:
        flags["--optimizer"] = optimizer
    part = f"(a-e) torch profiler, not Nsight Systems ({why}): forward, and a training step with {optimizer_name}"
    steps = sweep(options, target, "nsys_profile", "torch_profiler", part, size, flags)
    for step in steps:
        if step.status == "run":
            step.reads = tuple(path for path in step.flags["--output"] if path.endswith(".jsonl"))
    return steps


def memory_profiling(options: Options, target: Target) -> list[Step]:
    options = memory_options(options)
    scale, edition = options.scale, options.edition
    size = scale.memory_size[edition] if not scale.sizes else scale.sizes[0]
    contexts = list(scale.memory_contexts[edition])
    steps = sweep(
        options,
        target,
        "memory_profiling",
        "peaks",
        "(b, c) peaks",
        size,
        {"--context-lengths": contexts, "--pass-types": ["forward", "train-step"], "--precisions": ["fp32", "bf16"]},
        tool=MEMORY_SWEEP,
    )
    for pass_type in ("forward", "train-step"):
        steps += _snapshot_steps(options, target, size, contexts[0], pass_type)
    if edition == "2026":
        steps.append(_residuals_step(options, size, contexts[0]))
    return steps


def _snapshot_steps(options: Options, target: Target, size: str, context: int, pass_type: str) -> list[Step]:
    """One step recording the CUDA allocator over a measured step, one drawing it (GPU only: the
    snapshot is the CUDA caching allocator's history)."""
    name = f"memory_profiling-snapshot-{pass_type}"
    flags = {
        **model_flags(options, size),
        "--context-length": context,
        "--batch-size": options.scale.batch,
        "--pass-type": pass_type,
        "--warmup-steps": 1,
        "--measure-steps": 1,
        "--device": options.device,
        "--memory-snapshot": f"{name}.pickle",
    }
    flags["--model-size"] = flags.pop("--model-sizes")[0]
    record = Step(
        name,
        "memory_profiling",
        f"(a) memory snapshot of one {pass_type} ({size}, context {context}), for pytorch.org/memory_viz",
        module_name("benchmark"),
        flags,
        kind="benchmark",
    )
    drawn = Step(
        f"{name}-timeline",
        "memory_profiling",
        f"(a, e) active memory timeline of the {pass_type} snapshot, and its largest allocations",
        module_name("memory.timeline"),
        {"--snapshot": f"{name}.pickle", "--plot": f"{name}.png", "--output": f"{name}-largest.csv"},
        reads=(f"{name}-largest.csv",),
        figures=(f"{name}.png",),
        fixed_s=10,
    )
    peak = worst_peak(options, target, flags, module_name("benchmark"))
    verdict, why = fit_verdict(peak, target)
    if target.type != "cuda":
        record.skip("a memory snapshot records the CUDA caching allocator: needs a GPU")
        drawn.skip("draws the memory snapshot, which needs a GPU")
    elif verdict == "no":
        record.predicted_peak_bytes = peak
        record.skip(why)
        drawn.skip(f"draws the {pass_type} snapshot, which is not taken: it does not fit")
    return [record, drawn]


def _residuals_step(options: Options, size: str, context: int) -> Step:
    flags = {
        **model_flags(options, size),
        "--context-length": context,
        "--batch-size": options.scale.batch,
        "--device": options.device,
        "--output": ["memory_profiling-residuals.csv"],
    }
    flags["--model-size"] = flags.pop("--model-sizes")[0]
    step = Step(
        "memory_profiling-residuals",
        "memory_profiling",
        f"(f) what autograd saves per block ({size})",
        module_name("residuals"),
        flags,
        reads=("memory_profiling-residuals.csv",),
        capture="memory_profiling-residuals.txt",
        fixed_s=90,
    )
    if options.model_factory:
        flags.pop("--model-factory")
        step.reductions.append("residuals reads the built-in model's blocks (not your --model-factory)")
    if options.scale.name == "small":
        flags["--no-compile"] = True
        step.fixed_s = 20
        step.reductions.append("small scale: the compiled block is left out (compiling it takes a minute on a CPU)")
    return step
