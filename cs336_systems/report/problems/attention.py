"""The write-up's attention problems: pytorch_attention, torch_compile, flash_benchmarking and the
2025 leaderboard (FlashAttention-2 forward and backward)."""

from __future__ import annotations

import pandas as pd

from .. import attention, plots
from ..document import Bullets, Heading, Section, Text, sig3
from ..fields import label_text
from ..observe import number, ok, pick, records, slope, span
from . import Problem, finish, section
from .timing import compiled_model

MIB = 2**20


def pytorch_attention(problem: Problem) -> Section:
    out = section(problem)
    rows = problem.rows("attention_bench")
    if not rows.empty:
        out.add(attention.timing_table(rows, "Naive attention: time and memory per head dimension and sequence length"))
        out.add(*plots.attention_plot(rows, problem.out_dir, f"{problem.stem}_pytorch_attention"))
        out.add(Bullets(attention_observations(records(rows, "attention_bench"))))
    return finish(problem, out)


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
        took = slope([(number(r, "context_length"), number(r, "forward_mean_ms")) for r in mine])
        parts = []
        if held is not None:
            parts.append(f"memory held before backward grows as sequence^{held:.1f}")
        if took is not None:
            parts.append(f"forward time as sequence^{took:.1f}")
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


def torch_compile(problem: Problem, eager: Problem | None) -> Section:
    out = section(problem)
    compiled = problem.rows("attention_bench")
    out.add(Heading("(a) Compiled attention against the uncompiled one"))
    if not compiled.empty:
        base = eager.rows("attention_bench") if eager else pd.DataFrame()
        both = pd.concat([base, compiled], ignore_index=True)
        out.add(attention.versus_table(both, "naive", "compiled", "Uncompiled (naive) and compiled attention"))
        out.add(Bullets(versus_observations(records(both, "attention_bench"), "naive", "compiled")))
    compiled_model(problem, out)
    return finish(problem, out)


def versus_observations(rows: list[dict], base: str, other: str) -> list[str]:
    lines = []
    for phase in ("forward", "backward", "end_to_end"):
        ratios = []
        for row in ok(rows):
            if label_text("implementation", row) != base:
                continue
            shape = {k: label_text(k, row) for k in ("head_dim", "context_length", "precision")}
            partner = pick(ok(rows), implementation=other, **shape)
            a, b = number(row, f"{phase}_mean_ms"), number(partner, f"{phase}_mean_ms")
            if a and b:
                ratios.append((a / b, shape))
        if ratios:
            best = max(ratios, key=lambda r: r[0])
            lines.append(
                f"{phase.replace('_', '-')}: {other} runs {span([r for r, _ in ratios])} as fast as {base}; the largest "
                f"gain at head dim {best[1]['head_dim']}, sequence {best[1]['context_length']} ({best[1]['precision']})."
            )
    return lines


def flash_benchmarking(problem: Problem) -> Section:
    out = section(problem)
    rows = problem.rows("attention_bench")
    if not rows.empty:
        flash = [i for i in attention.implementations(rows) if i.startswith("flash")]
        out.add(attention.timing_table(rows, "Your FlashAttention-2 and PyTorch attention"))
        caveats = _flash_caveats(rows)
        if caveats:
            out.add(Text("About these rows: " + " ".join(caveats)))
        base = "naive" if (rows["implementation"] == "naive").any() else None
        for name in flash:
            if base:
                out.add(attention.speedup_only_table(rows, base, name, f"Speedup of {name} over {base}"))
                out.add(
                    Bullets(
                        versus_observations(records(rows, "attention_bench"), base, name)
                        + correctness(records(rows, "attention_bench"), name)
                    )
                )
    return finish(problem, out)


def _flash_caveats(rows: pd.DataFrame) -> list[str]:
    """Each distinct note of the flash rows once (e.g. a forward that ignores is_causal), not per row."""
    notes = []
    for row in records(rows, "attention_bench"):
        for note in str(row.get("notes") or "").split("; "):
            if note and "CV" not in note and note not in notes and note != "None":
                notes.append(note)
    implementations = ", ".join(i for i in attention.implementations(rows) if i.startswith("flash"))
    return [f"{implementations}: {note}." for note in notes]


def correctness(rows: list[dict], implementation: str) -> list[str]:
    mine = [r for r in rows if label_text("implementation", r) == implementation]
    out_err = [number(r, "max_abs_err_out") for r in mine if number(r, "max_abs_err_out") is not None]
    grad_err = [number(r, "max_abs_err_grad") for r in mine if number(r, "max_abs_err_grad") is not None]
    tolerance = next((number(r, "check_tolerance") for r in mine if number(r, "check_tolerance")), None)
    if not out_err:
        return []
    text = f"Checked against fp32 attention: largest output error {max(out_err):.1e}"
    text += f", gradient error {max(grad_err):.1e}" if grad_err else ""
    text += f" (tolerance {tolerance:.0e})" if tolerance else ""
    return [text + "."]


def leaderboard_2025(problem: Problem) -> Section:
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
        best = [number(r, "end_to_end_mean_ms") for r in ok(records(rows, "attention_bench"))]
        if best:
            out.add(Bullets([f"Forward plus backward: {sig3(min(best))} ms (the leaderboard's number)."]))
    return finish(problem, out)
