"""The handout's leaderboard, each edition's own: 2025 times the student's Triton FlashAttention-2
forward + backward; 2026 a full training step (zero_grad, forward, cross-entropy, backward, AdamW step)
of the student's model with their AdamW in bf16, both with triton.testing.do_bench as the leaderboard
does. The 2026 configuration (8B) rarely fits one GPU: where the estimator says it does not, the
largest that does is named instead (the handout's context kept as long as possible, then fewer layers)."""

from __future__ import annotations

from dataclasses import dataclass

from ...report import attention
from ...report.document import Section, sig3
from ...report.fields import label_text
from ...report.grid import Value, grid
from ...report.observe import maker, number, observations, ok
from ...tools import module_name
from ..parameters import SMALL_SHAPE, Options
from ..plan import Step, fit_verdict, model_configs, predicted_peak
from ..target import Target
from .attention import attention_step
from .base import Problem, Results, finish, section
from .model_steps import STUDENT_MODEL, defined_in_repository, training_optimizer

LABEL = "leaderboard"
# 2026: a full training step of the handout's 8B configuration (its Config: bf16, causal, AdamW, timed
# by do_bench on two B200s); 2025: the FlashAttention-2 forward + backward (batch x heads, sequence, d)
MODEL_8B = {
    "--vocab-size": 151_936,
    "--d-model": 4096,
    "--d-ff": 11_008,
    "--num-layers": 34,
    "--num-heads": 32,
    "--context-length": 32_768,
    "--batch-size": 2,
}


@dataclass(frozen=True)
class Shapes:
    flash: tuple[int, int, int]  # 2025: (batch x heads, sequence, head dim)
    training: dict  # 2026: the model and batch of the training step
    training_name: str


SHAPES = {
    "full": Shapes((16, 16384, 64), MODEL_8B, "the handout's 8B configuration"),
    "small": Shapes(
        (2, 128, 16), {**SMALL_SHAPE, "--context-length": 128, "--batch-size": 2}, "a tiny configuration (small scale)"
    ),
}
MIN_CONTEXT = 128  # a smaller configuration keeps at least this context
BENCHMARK = module_name("benchmark")


def flash_leaderboard(options: Options, target: Target) -> list[Step]:
    batch_heads, sequence, head_dim = SHAPES[options.scale.name].flash
    step = attention_step(
        options,
        LABEL,
        LABEL,
        f"your Triton FlashAttention-2, forward + backward, {batch_heads} heads x {head_dim}, sequence {sequence}, "
        "bf16, causal, do_bench",
        {
            "--implementations": ["flash-triton"],
            "--adapters": options.adapters or "tests/adapters.py",
            "--layout": "bsd",
            "--batch-size": batch_heads,
            "--head-dims": [head_dim],
            "--context-lengths": [sequence],
            "--precisions": ["bf16"],
            "--timer": "do-bench",
            "--warmup-steps": 5,
            "--measure-steps": options.scale.attention_measure,
        },
    )
    if not options.adapters:
        step.skip("needs your Triton FlashAttention-2: --adapters tests/adapters.py")
    elif target.type != "cuda" or not target.triton:
        step.skip("the leaderboard times the Triton kernel on a GPU: needs CUDA and Triton")
    return [step]


def leaderboard_peak(target: Target, flags: dict, layers: int, context: int) -> int:
    """The estimator's peak of the step `flags` (benchmark's) with this many layers at this context."""
    changed = {**flags, "--num-layers": layers, "--context-length": context}
    return predicted_peak(target, model_configs(BENCHMARK, changed)[0])


def fitted_configuration(target: Target, flags: dict) -> tuple[int, int] | None:
    """(layers, context) of the largest configuration that fits (not borderline: an 8B-class step is
    not worth an oom): the handout's context halved only when not even one layer fits at it, and at
    each context as many layers as fit. None: nothing does."""
    context = flags["--context-length"]
    while context >= MIN_CONTEXT:
        for layers in range(flags["--num-layers"], 0, -1):
            if fit_verdict(leaderboard_peak(target, flags, layers, context), target)[0] == "fits":
                return layers, context
        context //= 2
    return None


def training_leaderboard(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    shape = dict(SHAPES[scale.name].training)
    model_factory = options.model_factory or (STUDENT_MODEL if defined_in_repository(STUDENT_MODEL) else None)
    optimizer, optimizer_name, optimizer_note = training_optimizer(options)
    # the handout's own model materialises the T x T scores: estimate a student's model as naive attention
    attention = "naive" if model_factory else "sdpa"
    layers, context = shape["--num-layers"], shape["--context-length"]
    flags = {  # benchmark's flags; the fit below may set fewer layers and a shorter context
        "--model-size": "small",  # a name the overrides below replace: a custom shape
        "--size-table": options.edition,
        "--vocab-size": shape["--vocab-size"],
        "--d-model": shape["--d-model"],
        "--d-ff": shape["--d-ff"],
        "--num-layers": layers,
        "--num-heads": shape["--num-heads"],
        "--context-length": context,
        "--batch-size": shape["--batch-size"],
        "--pass-type": "train-step",
        "--precision": "bf16",
    }
    estimated = {**flags, "--attention": attention}  # the built-in model the estimator stands in with
    full_peak = leaderboard_peak(target, estimated, layers, context)
    gpu = target.type == "cuda"
    fitted = fitted_configuration(target, estimated) if gpu and scale.name == "full" else (layers, context)
    named = SHAPES[scale.name].training_name
    notes = []
    if fitted is not None and fitted != (layers, context):
        notes.append(
            f"smaller than the handout's: {fitted[0]} of {layers} layers at context {fitted[1]:,}, the largest "
            f"the estimator says fits ({named} is {fit_verdict(full_peak, target)[1]})"
        )
        layers, context = fitted
        named = f"{named} with {layers} of {shape['--num-layers']} layers at context {context:,}"
    timer = "do-bench" if gpu and target.triton else "cuda-event" if gpu else "host"
    flags.update(
        {
            "--num-layers": layers,
            "--context-length": context,
            "--timer": timer,
            "--warmup-steps": 0 if timer == "do-bench" else scale.warmup,  # do_bench warms up by itself
            "--measure-steps": 3 if timer == "do-bench" else scale.measure,
            "--device": options.device,
            "--output": [f"{LABEL}.csv", f"{LABEL}.jsonl", f"{LABEL}.md"],
        }
    )
    if model_factory:
        flags["--model-factory"] = model_factory
    if optimizer:
        flags["--optimizer"] = optimizer
    model_name = f"your model ({model_factory})" if model_factory else "the built-in model"
    timed = {"do-bench": "do_bench", "cuda-event": "CUDA events (no Triton here)", "host": "the host timer (no GPU)"}
    step = Step(
        LABEL,
        LABEL,
        f"a full training step of {model_name} with {optimizer_name}, bf16 autocast, {named}, "
        f"batch {shape['--batch-size']}, timed with {timed[timer]}",
        module_name("benchmark"),
        flags,
        kind="benchmark",
        reads=(f"{LABEL}.csv",),
        estimate_builtin=True,  # the student's model is the handout's architecture
        estimate_attention=attention,
    )
    step.reductions += notes + ([optimizer_note] if optimizer_note else [])
    if scale.name != "full":  # the leaderboard's own configuration, on two B200s, is the handout's answer
        step.reductions.append(f"{SHAPES[scale.name].training_name}, not {SHAPES['full'].training_name}")
    if not model_factory:
        step.reductions.append(f"the built-in model: no --model-factory given and no {STUDENT_MODEL} found")
    if not gpu and scale.name == "full":
        step.skip("the leaderboard times a GPU training step of an 8B-class model: needs CUDA")
    elif fitted is None:
        step.predicted_peak_bytes = full_peak
        step.skip(
            f"no configuration down to 1 layer and context {MIN_CONTEXT} fits: {fit_verdict(full_peak, target)[1]}"
        )
    elif timer == "cuda-event":
        step.reductions.append("Triton is not installed: CUDA event pairs instead of do_bench")
    return [step]


def write_flash(problem: Results) -> Section:
    out = section(problem)
    rows = problem.rows("attention_bench")
    if not rows.empty:
        out.add(
            attention.timing_table(
                rows,
                "FlashAttention-2 forward and backward, the leaderboard's shape",
                phases=("forward", "backward", "end_to_end"),
            )
        )
        out.add(observations(leaderboard_observations, rows, "attention_bench"))
    return finish(problem, out)


@maker
def leaderboard_observations(rows: list[dict]) -> list[str]:
    best = [number(r, "end_to_end_median_ms") for r in ok(rows) if number(r, "end_to_end_median_ms")]
    return [f"Forward plus backward: {sig3(min(best))} ms, the median (the leaderboard's number)."] if best else []


def write_training(problem: Results) -> Section:
    out = section(problem)
    rows = problem.rows("benchmark")
    if not rows.empty:
        out.add(
            grid(
                rows,
                "benchmark",
                title="A full training step: zero_grad, forward, cross-entropy, backward, AdamW step",
                caption="Mean ± std of the measured steps (do_bench's statistic), and their median, which tokens/s "
                "is computed on, ms",
                labels=[("model", "model"), ("context", "context_length"), ("batch", "batch_size")],
                values=[
                    Value("step (ms)", "mean_ms", "ms±"),
                    Value("median step (ms)", "median_ms", "ms"),
                    Value("tokens/s", "tokens_per_s", "sig3"),
                ],
            )
        )
        out.add(observations(training_observations, rows, "benchmark"))
    return finish(problem, out)


@maker
def training_observations(rows: list[dict]) -> list[str]:
    return [
        f"{row['model']}, context {label_text('context_length', row)}, batch {label_text('batch_size', row)}, "
        f"{label_text('precision', row)}: a median of {sig3(number(row, 'median_ms'))} ms per training step "
        f"({label_text('timer', row)} timer)."
        for row in ok(rows)
    ]


PLANS = {"2025": flash_leaderboard, "2026": training_leaderboard}
WRITERS = {"2025": write_flash, "2026": write_training}
PROBLEM = Problem(
    LABEL,
    "Leaderboard: Fastest Training Step",
    plan=lambda options, target: PLANS[options.edition](options, target),
    write=lambda results: WRITERS[results.edition](results),
    titles={"2025": "FlashAttention-2 Leaderboard"},
)
