"""python -m cs336_systems.report: a Markdown report, with plots, from result files.

    python -m cs336_systems.report results/sweep.csv results/more.jsonl --output writeup/report.md \
        [--note "A paragraph for the reader, placed under the title."]

Sections: the environment; one table per (pass type, precision, and whatever else varies:
compile, attention, batch, device) with sizes as rows and contexts as columns, cells
"mean ± std ms" and failures marked; MFU and peak-memory tables beside them; speedup
tables (bf16, fp16 and tf32 vs fp32; compile vs eager) wherever both sides exist; rows
flagged as slow or noisy; PNG plots saved beside the report and linked from it.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from cs336_systems.anomalies import flag_anomalies  # noqa: E402
from cs336_systems.argtypes import ArgumentParser, fail  # noqa: E402
from cs336_systems.models import MODEL_SIZES  # noqa: E402
from cs336_systems.results import (  # noqa: E402
    ResultFileError,
    environment_lines,
    read_results,
    row_label,
    row_warnings,
)
from cs336_systems.stats import HIGH_CV_PCT, is_noisy  # noqa: E402

PROG = "python -m cs336_systems.report"
# Besides pass type and precision, a table is split by whatever of these varies.
TABLE_KEYS = ("pass_type", "precision", "compile", "attention", "batch_size", "device_name")
FAILURE_MARK = {"oom": "OOM", "error": "error", "timeout": "timeout", "unsupported": "n/a"}
SPEEDUPS = (("precision", "fp32", "bf16"), ("precision", "fp32", "fp16"), ("precision", "fp32", "tf32"),
            ("compile", False, True))  # fmt: skip


def load(paths: Sequence[str]) -> pd.DataFrame:
    frames = []
    for path in paths:
        if not Path(path).exists():
            raise ResultFileError(f"{path}: no such file")
        frame = read_results(path)
        if "status" not in frame.columns or "mean_ms" not in frame.columns:
            raise ResultFileError(f"{path}: not a benchmark result file (no status / mean_ms columns)")
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True)
    for key in TABLE_KEYS:  # files from older versions may lack a column
        if key not in frame.columns:
            frame[key] = None
    frame["compile"] = frame["compile"].astype(str).str.lower().eq("true")
    frame["model"] = [model_label(row) for row in frame.to_dict("records")]
    return frame


def model_label(row: dict) -> str:
    """The row label of a table: the size name, or the shape (and factory) of a custom model,
    so that two different custom models never share a row."""
    if row.get("model_size") != "custom":
        return str(row.get("model_size"))
    shape = f"d{row.get('d_model')} L{row.get('num_layers')} ff{row.get('d_ff')} V{row.get('vocab_size')}"
    factory = row.get("model_factory")
    return f"{factory} {shape}" if isinstance(factory, str) and factory else f"custom {shape}"


def size_order(frame: pd.DataFrame) -> list[str]:
    """Named sizes in the table's order, then other models by parameter count."""
    known = [name for name in MODEL_SIZES if name in set(frame["model"])]
    others = frame[~frame["model"].isin(known)].sort_values("num_params", na_position="last")["model"]
    return known + list(dict.fromkeys(others))


NOISY_MARK = "†"  # CV above stats.HIGH_CV_PCT: the mean is not to be trusted alone


IMPOSSIBLE_MFU_MARK = "‡"  # above 100%: the peak it was divided by is wrong for this row


def impossible_mfu_note(row: dict) -> str | None:
    """MFU above 100% cannot be: say which peak was wrong and why it may be."""
    mfu = row.get("mfu")
    if mfu is None or pd.isna(mfu) or mfu <= 1:
        return None
    why = {
        "measured": "the peak was measured by a matmul probe while the machine ran slower than during this row "
        "(a shared or throttled machine); pass --peak-tflops, or compare achieved_tflops instead",
        "user": "the --peak-tflops given is below what this row achieved",
    }.get(row.get("peak_source"), "the peak used is below what this row achieved")
    return (
        f"{row_label(row)}: MFU {100 * mfu:.0f}% {IMPOSSIBLE_MFU_MARK} is impossible: achieved "
        f"{row['achieved_tflops']:.4f} TFLOP/s against a peak of {row['peak_tflops']:.4f} ({row.get('peak_source')}): {why}"
    )


def _noisy(row) -> bool:
    return is_noisy(None if pd.isna(row.get("cv_pct")) else float(row["cv_pct"]))


def _cell(rows: pd.DataFrame) -> str:
    row = rows.iloc[-1]  # the latest measurement of a configuration wins
    if row["status"] != "ok":
        return FAILURE_MARK.get(row["status"], row["status"])
    std = "" if pd.isna(row["std_ms"]) else f" ± {row['std_ms']:.1f}"
    return f"{row['mean_ms']:.1f}{std}" + (f" {NOISY_MARK}" if _noisy(row) else "")


def _pivot(rows: pd.DataFrame, sizes: list[str], cell) -> pd.DataFrame:
    contexts = sorted(rows["context_length"].unique())
    table = pd.DataFrame(index=[s for s in sizes if s in set(rows["model"])], columns=contexts, dtype=object)
    for (size, context), group in rows.groupby(["model", "context_length"]):
        table.loc[size, context] = cell(group)
    table = table.fillna("")
    table.columns = [f"ctx {c}" for c in table.columns]
    table.index.name = "model"
    return table


def _varying(frame: pd.DataFrame) -> list[str]:
    return [key for key in TABLE_KEYS if key in ("pass_type", "precision") or frame[key].nunique(dropna=False) > 1]


def _title(keys: list[str], values: tuple) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in zip(keys, values))


def _memory_mfu_cell(rows: pd.DataFrame) -> str:
    row = rows.iloc[-1]
    if row["status"] != "ok":
        return FAILURE_MARK.get(row["status"], row["status"])
    parts = []
    if not pd.isna(row.get("mfu")):
        parts.append(f"{100 * row['mfu']:.1f}%" + (f" {IMPOSSIBLE_MFU_MARK}" if row["mfu"] > 1 else ""))
    if not pd.isna(row.get("peak_memory_bytes")):
        parts.append(f"{row['peak_memory_bytes'] / 2**30:.2f} GiB")
    return " / ".join(parts)


def speedup_tables(frame: pd.DataFrame, sizes: list[str]) -> list[str]:
    """base time / other time per (size, context), where both sides ran."""
    out = []
    ok = frame[frame["status"] == "ok"]
    for key, base, other in SPEEDUPS:
        rest = [k for k in _varying(frame) if k != key]
        for values, rows in ok.groupby(rest, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            base_rows, other_rows = rows[rows[key] == base], rows[rows[key] == other]
            if base_rows.empty or other_rows.empty:
                continue
            base_last = base_rows.groupby(["model", "context_length"]).last()
            other_last = other_rows.groupby(["model", "context_length"]).last()
            ratio = (base_last["mean_ms"] / other_last["mean_ms"]).dropna()
            if ratio.empty:
                continue
            noisy = base_last.apply(_noisy, axis=1).reindex(ratio.index) | other_last.apply(_noisy, axis=1).reindex(
                ratio.index
            )
            cells = pd.Series(
                [f"{x:.2f}x" + (f" {NOISY_MARK}" if n else "") for x, n in zip(ratio, noisy)], index=ratio.index
            )
            table = cells.unstack("context_length").fillna("")
            table = table.reindex([s for s in sizes if s in table.index])
            table.columns = [f"ctx {c}" for c in table.columns]
            table.index.name = "model"
            label = (
                {True: "compiled", False: "eager"}.get(other, other),
                {True: "compiled", False: "eager"}.get(base, base),
            )
            out += [f"### Speedup of {label[0]} over {label[1]}: {_title(rest, values)}", "",
                    table.to_markdown(), ""]  # fmt: skip
    return out


def _panels(count: int):
    columns = min(count, 2)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4.3 * rows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes.flat


def plots(frame: pd.DataFrame, sizes: list[str], directory: Path, stem: str) -> list[tuple[str, Path]]:
    """Step time against context length (a line per model) and against parameter count (a
    line per context), one panel per table; log-log, measured rows only."""
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return []
    keys = _varying(frame)
    groups = list(ok.groupby(keys, dropna=False, sort=False))  # the tables' order
    made = []
    for name, title, x, series, label in (
        ("time_vs_context", "Step time vs context length, per model", "context_length", "model", "{}"),
        ("time_vs_params", "Step time vs parameter count, per context length", "num_params", "context_length",
         "ctx {}"),
    ):  # fmt: skip
        fig, axes = _panels(len(groups))
        for ax, (values, rows) in zip(axes, groups):
            values = values if isinstance(values, tuple) else (values,)
            order = [s for s in sizes if s in set(rows["model"])] if series == "model" else sorted(set(rows[series]))
            for value in order:
                line = rows[rows[series] == value].groupby(x)[["mean_ms", "min_ms", "max_ms"]].last()
                spread = [
                    (line["mean_ms"] - line["min_ms"]).clip(lower=0),  # (rounding can put min a hair above mean)
                    (line["max_ms"] - line["mean_ms"]).clip(lower=0),
                ]  # min..max rather than ± std: never below zero on a log axis
                ax.errorbar(line.index, line["mean_ms"], yerr=spread, marker="o", capsize=3, label=label.format(value))
            ax.set(xscale="log", yscale="log", ylabel="mean step time (ms); bars: min to max step",
                   xlabel="context length" if x == "context_length" else "parameters")  # fmt: skip
            if x == "context_length":  # label the contexts measured, not powers of ten
                ax.set_xticks(sorted(set(rows[x])), [str(c) for c in sorted(set(rows[x]))])
                ax.minorticks_off()
            ax.set_title(_title(keys, values), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / f"{stem}_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append((title, path))
    return made


def build_report(frame: pd.DataFrame, sources: Sequence[str], output: Path, notes: Sequence[str] = ()) -> str:
    """The Markdown text; `notes` are the author's paragraphs, placed under the title."""
    sizes = size_order(frame)
    keys = _varying(frame)
    command = shlex.join([*PROG.split(), *sources, *(x for note in notes for x in ("--note", note)),
                          "--output", str(output)])  # fmt: skip
    lines = ["# Benchmark report", "", *(line for note in notes for line in (note, "")),
             f"Generated by `{command}`.", ""]  # fmt: skip
    lines += ["## Environment", "", *environment_lines(frame.to_dict("records")), ""]
    lines += ["## Step time (mean ± std ms)", "",
              "Cells are mean ± sample standard deviation of the measured steps; OOM = out of memory, "
              f"n/a = unsupported on that machine; {NOISY_MARK} = CV above {HIGH_CV_PCT:g}%, noisy (see Notes).",
              ""]  # fmt: skip
    for values, rows in frame.groupby(keys, dropna=False, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        lines += [f"### {_title(keys, values)}", "", _pivot(rows, sizes, _cell).to_markdown(), ""]
        if rows["status"].eq("ok").any():
            lines += [f"MFU / peak memory ({IMPOSSIBLE_MFU_MARK} = above 100%, see Notes):", "",
                      _pivot(rows, sizes, _memory_mfu_cell).to_markdown(), ""]  # fmt: skip
    speedups = speedup_tables(frame, sizes)
    if speedups:
        lines += ["## Speedups", "",
                  f"Base mean time / other mean time, same size and context; {NOISY_MARK}: either side is noisy.", "",
                  *speedups]  # fmt: skip
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    notes = [line for row in records for line in row_warnings(row)]
    notes += [f"{row_label(records[i])}: SLOW: {why}" for i, why in sorted(flag_anomalies(records).items())]
    notes += [note for row in records if (note := impossible_mfu_note(row))]
    if notes:
        lines += ["## Notes", "", *(f"- {note}" for note in notes), ""]
    made = plots(frame, sizes, output.parent, output.stem)
    if made:
        lines += ["## Plots", ""]
        lines += [f"![{title}]({path.name})" + "\n" for title, path in made]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="result files (.csv or .jsonl)")
    parser.add_argument("--output", type=Path, default=Path("writeup/report.md"))
    parser.add_argument("--note", action="append", default=[], help="a paragraph under the title (repeatable)")
    args = parser.parse_args(argv)
    try:
        frame = load(args.results)
    except (ResultFileError, ValueError) as exc:
        return fail(PROG, str(exc))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    text = build_report(frame, args.results, args.output, args.note)
    args.output.write_text(text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
