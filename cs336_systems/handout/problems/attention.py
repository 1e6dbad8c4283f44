"""The attention problems: pytorch_attention (naive attention over the handout's grid of head sizes
and sequence lengths, out-of-memory as rows), torch_compile (the same grid compiled, and the whole
model compiled) and flash_benchmarking (the student's FlashAttention-2 against PyTorch attention)."""

from __future__ import annotations

import pandas as pd

from ...report import attention, benchmark, plots
from ...report.document import Heading, Section, sig3
from ...report.fields import label_text
from ...report.observe import maker, number, observations, ok, pick, say, slope, span, under_load, versus
from ...stats import is_noise_warning
from ...tools import module_name
from ...units import MIB
from ..parameters import Options
from ..plan import Step
from ..target import Target
from .base import Problem, Results, finish, section
from .model_steps import sizes, sweep

PYTORCH_ATTENTION, TORCH_COMPILE, FLASH_BENCHMARKING = "pytorch_attention", "torch_compile", "flash_benchmarking"


def attention_step(options: Options, name: str, problem: str, part: str, flags: dict) -> Step:
    """One attention_bench run: its rows (CSV, JSONL, Markdown) and its plot."""
    flags = {
        **flags,
        "--device": options.device,
        "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
        "--plot": f"{name}.png",
    }
    return Step(
        name,
        problem,
        part,
        module_name("attention_bench"),
        flags,
        kind="attention",
        reads=(f"{name}.csv",),
        figures=(f"{name}.png",),
    )


def pytorch_attention_grid(options: Options, implementation: str) -> dict:
    """attention_bench's flags for pytorch_attention's grid of shapes, run by `implementation`."""
    scale = options.scale
    return {
        "--implementations": [implementation],
        "--batch-size": scale.attention_batch,
        "--head-dims": list(scale.attention_head_dims),
        "--context-lengths": list(scale.attention_contexts),
        "--warmup-steps": 5,
        "--measure-steps": scale.attention_measure,
    }


def plan_pytorch_attention(options: Options, target: Target) -> list[Step]:
    step = attention_step(
        options,
        PYTORCH_ATTENTION,
        PYTORCH_ATTENTION,
        f"(a) naive attention, batch {options.scale.attention_batch}, one head, forward and backward",
        pytorch_attention_grid(options, "naive"),
    )
    step.reason = (
        "runs every shape, those predicted not to fit too: the handout asks where attention runs "
        "out of memory, and attention_bench records an out-of-memory as an oom row"
    )
    return [step]


def plan_torch_compile(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    attention = attention_step(
        options,
        f"{TORCH_COMPILE}-attention",
        TORCH_COMPILE,
        "(a) torch.compile'd attention on the pytorch_attention grid",
        pytorch_attention_grid(options, "compiled"),
    )
    attention.reason = "runs every shape (out-of-memory is a row, as in pytorch_attention)"
    steps = [attention]
    for size in sizes(options):
        steps += sweep(
            options,
            target,
            TORCH_COMPILE,
            "b",
            "(b) compiled model",
            size,
            {
                "--context-lengths": [scale.timing_context],
                "--pass-types": ["forward", "train-step"],
                "--precisions": ["fp32"],
                "--compile": "both",
            },
        )
    return steps


def plan_flash_benchmarking(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    implementations = ["naive", "flash-triton" if target.type == "cuda" else "flash-pytorch"]
    step = attention_step(
        options,
        FLASH_BENCHMARKING,
        FLASH_BENCHMARKING,
        f"(a) your FlashAttention-2 ({implementations[1]}) against PyTorch attention, batch 1, causal",
        {
            "--implementations": implementations,
            "--adapters": options.adapters or "tests/adapters.py",  # the command kept where it is skipped
            "--layout": "bsd",
            "--batch-size": 1,
            "--head-dims": list(scale.flash_head_dims),
            "--context-lengths": list(scale.flash_contexts),
            "--precisions": ["bf16", "fp32"],
            "--timer": "do-bench" if target.type == "cuda" else "host",
            "--warmup-steps": 5,
            "--measure-steps": scale.attention_measure,
        },
    )
    if not options.adapters:
        step.skip("needs your FlashAttention-2: --adapters tests/adapters.py")
    elif target.type != "cuda":
        step.reductions.append(
            "no GPU: your PyTorch FlashAttention-2 (flash-pytorch) instead of the Triton one, "
            "host timer instead of do_bench"
        )
    elif not target.triton:
        step.skip("flash-triton needs Triton, which is not installed")
    return [step]


def write_pytorch_attention(problem: Results) -> Section:
    out = section(problem)
    rows = problem.rows("attention_bench")
    out.add(Heading("(a) Time and memory of naive attention per head size and sequence length"))
    if not rows.empty:
        out.add(attention.timing_table(rows, "Naive attention: time and memory per head dimension and sequence length"))
        out.add(*plots.attention_plot(rows, problem.out_dir, f"{problem.stem}_pytorch_attention"))
        out.add(observations(attention_observations, rows, "attention_bench"))
    return finish(problem, out)


@maker
def attention_observations(rows: list[dict]) -> list[str]:
    lines = []
    failed = [r for r in rows if r.get("status") == "oom"]
    if failed:
        first = min(failed, key=lambda r: (number(r, "context_length"), number(r, "head_dim")))
        lines.append(
            f"The first out-of-memory is at sequence length {label_text('context_length', first)} "
            f"(head dim {label_text('head_dim', first)}); {len(failed)} of {len(rows)} shapes ran out of memory."
        )
    else:
        lines.append(f"Every one of the {len(rows)} shapes ran; none ran out of memory on this device.")
    for d in dict.fromkeys(label_text("head_dim", r) for r in ok(rows)):
        mine = [r for r in ok(rows) if label_text("head_dim", r) == d]
        held = slope([(number(r, "context_length"), number(r, "memory_before_backward_bytes")) for r in mine])
        took = slope([(number(r, "context_length"), number(r, "forward_median_ms")) for r in mine])
        parts = []
        if held is not None:
            parts.append(f"memory held before backward grows as sequence^{held:.1f}")
        if took is not None:  # a slope of times compares the rows' times: none measured busy
            busy = under_load(mine)
            parts.append(
                f"forward time not compared ({busy})" if busy else f"forward median time as sequence^{took:.1f}"
            )
        if parts:
            lines.append(f"Head dim {d}: " + ", ".join(parts) + " (log-log slope over the measured lengths).")
    largest = max(ok(rows), key=lambda r: number(r, "scores_bytes") or 0, default=None)
    if number(largest, "scores_bytes"):
        lines.append(
            f"At sequence length {label_text('context_length', largest)} the score matrix alone is "
            f"{sig3(number(largest, 'scores_bytes') / MIB)} MiB (batch x seq x seq x element size), and the "
            "backward keeps it (and the softmax of it) until it runs."
        )
    return lines


def write_torch_compile(problem: Results) -> Section:
    out = section(problem)
    eager = problem.other(PYTORCH_ATTENTION)
    compiled = problem.rows("attention_bench")
    out.add(Heading("(a) Compiled attention against the uncompiled one"))
    if not compiled.empty:
        base = eager.rows("attention_bench") if eager else pd.DataFrame()
        both = pd.concat([base, compiled], ignore_index=True)
        out.add(attention.versus_table(both, "naive", "compiled", "Uncompiled (naive) and compiled attention"))
        out.add(observations(versus_observations, both, "attention_bench", base="naive", other="compiled"))
    compiled_model(problem, out)
    return finish(problem, out)


@maker
def versus_observations(rows: list[dict], base: str, other: str) -> list[str]:
    """`other` against `base` per phase over the shapes both ran, each claim from the two rows' steps."""
    lines = []
    for phase in ("forward", "backward", "end_to_end"):
        found = []
        for row in ok(rows):
            if label_text("implementation", row) != base:
                continue
            shape = {k: label_text(k, row) for k in ("head_dim", "context_length", "precision")}
            partner = pick(ok(rows), implementation=other, **shape)
            where = f"head dim {shape['head_dim']}, sequence {shape['context_length']} ({shape['precision']})"
            found.append((versus(partner, row, phase), where))
        name = phase.replace("_", "-")
        if text := say(found, f"{other} ({name})", base, "speed", "shapes"):
            lines.append(text + ".")
    return lines


def write_flash_benchmarking(problem: Results) -> Section:
    out = section(problem)
    rows = problem.rows("attention_bench")
    out.add(Heading("(a) Your FlashAttention-2 against PyTorch attention"))
    if not rows.empty:
        flash = [i for i in attention.implementations(rows) if i.startswith("flash")]
        out.add(attention.timing_table(rows, "Your FlashAttention-2 and PyTorch attention"))
        out.add(observations(flash_caveats, rows, "attention_bench"))
        base = "naive" if (rows["implementation"] == "naive").any() else None
        for name in flash:
            if base:
                out.add(attention.speedup_only_table(rows, base, name, f"Speedup of {name} over {base}"))
                out.add(observations(versus_observations, rows, "attention_bench", base=base, other=name))
                out.add(observations(correctness, rows, "attention_bench", implementation=name))
    return finish(problem, out)


@maker
def flash_caveats(rows: list[dict]) -> str:
    """Each distinct note of the rows once (e.g. a forward that ignores is_causal), not per row."""
    notes = []
    for row in rows:
        for note in str(row.get("notes") or "").split("; "):
            if note and not is_noise_warning(note) and note not in notes and note != "None":
                notes.append(note)
    names = ", ".join(dict.fromkeys(i for r in rows if (i := label_text("implementation", r)).startswith("flash")))
    return f"About these rows: {' '.join(f'{names}: {note}.' for note in notes)}" if notes else ""


@maker
def correctness(rows: list[dict], implementation: str) -> list[str]:
    """The check against fp32 attention as the rows' own verdict (a `wrong` row failed it, an `ok` row
    passed): how many shapes passed, and the largest errors beside what the check allows."""
    mine = [r for r in rows if label_text("implementation", r) == implementation]
    checked = [r for r in mine if r.get("status") in ("ok", "wrong") and number(r, "max_abs_err_out") is not None]
    if not checked:
        return []
    failed = [r for r in checked if r.get("status") == "wrong"]
    out_err = max(number(r, "max_abs_err_out") for r in checked)
    grad_err = [number(r, "max_abs_err_grad") for r in checked if number(r, "max_abs_err_grad") is not None]
    tolerance = next((number(r, "check_tolerance") for r in checked if number(r, "check_tolerance")), None)
    verdict = "passed" if not failed else f"failed at {len(failed)} of {len(checked)} shapes"
    text = f"Checked against fp32 attention: {verdict} (largest output error {out_err:.1e}"
    text += f", gradient error {max(grad_err):.1e}" if grad_err else ""
    text += f"; the check allows {tolerance:.0e} x max(1, largest |reference|))" if tolerance else ")"
    unchecked = [r for r in mine if r.get("status") not in ("ok", "wrong")]
    if unchecked:  # "passed" speaks only for the shapes that ran
        text += f", at the {len(checked)} shapes that ran; {len(unchecked)} failed before it (marked in the table)"
    return [text + "."]


def compiled_model(problem: Results, out: Section) -> None:
    """torch_compile (b): the whole model eager and compiled."""
    rows = problem.rows("benchmark")
    out.add(Heading("(b) The whole model compiled"))
    if rows.empty:
        return
    out.add(benchmark.speedup_table(rows, "compile", "eager", "compiled", "Eager and compiled model"))
    out.add(observations(compile_observations, rows, "benchmark"))


@maker
def compile_observations(rows: list[dict]) -> list[str]:
    rows, lines = ok(rows), []
    for pass_type in dict.fromkeys(label_text("pass_type", r) for r in rows):
        claims = [
            (versus(*(pick(rows, model=m, pass_type=pass_type, compile=c) for c in ("compiled", "eager"))), m)
            for m in dict.fromkeys(r["model"] for r in rows)
        ]
        if said := say(claims, f"compiled ({pass_type})", "eager", "speed", "models"):
            lines.append(said + ".")
    first = [number(r, "compile_s") for r in rows if number(r, "compile_s")]
    if first:
        lines.append(f"Compiling took {span(first, lambda v: sig3(v) + ' s')} before the first step.")
    return lines


PYTORCH_ATTENTION_PROBLEM = Problem(
    PYTORCH_ATTENTION, "PyTorch Attention Benchmarking", plan=plan_pytorch_attention, write=write_pytorch_attention
)
TORCH_COMPILE_PROBLEM = Problem(TORCH_COMPILE, "Torch Compile", plan=plan_torch_compile, write=write_torch_compile)
FLASH_BENCHMARKING_PROBLEM = Problem(
    FLASH_BENCHMARKING, "FlashAttention-2 Benchmarking", plan=plan_flash_benchmarking, write=write_flash_benchmarking
)
