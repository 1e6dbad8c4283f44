"""python -m cs336_systems.compare: is NEW slower than BASE?

    cs336-bench compare results/base.csv results/new.csv --fail-above 10

Rows are matched on the identity columns BenchmarkRecord marks (BenchmarkRecord.row_key, the same
key as BenchmarkConfig.key()); each matched pair gets NEW/BASE of the median step time and a verdict,
the write-up's claim of the two rows (report/observe.py): slower or faster only where the interval of the
ratio (from the rows' steps, or their interquartile ranges in a CSV) excludes 1, "cannot tell" where it
does not, "not compared" where either row was measured while other processes kept the machine busy,
and rows of other thread counts or devices said so. With --fail-above PCT the exit status is 1 when any
matched row is resolved slower by more than PCT percent, or failed in NEW after running in BASE;
otherwise 0. Without it, verdicts use a 5% band and the exit status is 0. Rows present on one side only
are listed, never failed.
"""

from __future__ import annotations

import argparse
import math
import sys

from tabulate import tabulate

from .argtypes import ArgumentParser, positive_float
from .command import Command
from .contention import describe_rows
from .report.fields import model_label
from .report.observe import NOT_COMPARED, RESOLVED, versus
from .results import BenchmarkRecord, ResultFileError, read_results, validate
from .results.readers import CUT
from .results.records import NONFINITE_LOSS_NOTE
from .stats import SAME_BAND_PCT
from .tools import prog

PROG = prog("compare")
DEFAULT_BAND_PCT = SAME_BAND_PCT
SHOWN = ("model", "context_length", "batch_size", "pass_type", "precision", "compile", "attention")
# What a reader needs to know before trusting a ratio: were both sides measured alike?
ENVIRONMENT_SHOWN = ("device_name", "torch_version", "cuda_version", "num_threads", "git_commit")


def _rows(path: str) -> dict[tuple, dict]:
    validate.check_not_rendering(path)
    frame = read_results(path)  # a file that is not a readable result file: ResultFileError naming it
    if frame.attrs.get(CUT):
        print(f"{PROG}: {frame.attrs[CUT]}", file=sys.stderr)
    missing = [
        name for name in (*BenchmarkRecord.identity_fields(), "status", "median_ms") if name not in frame.columns
    ]
    if missing:
        raise ResultFileError(f"{path}: not a benchmark result file (missing {', '.join(missing[:3])})")
    rows = {}
    for row in frame.astype(object).where(frame.notna(), None).to_dict("records"):
        row["model"] = model_label(row)
        rows[BenchmarkRecord.row_key(row)] = row  # a configuration measured twice: the later row counts
    return rows


def environment_summary(rows: dict[tuple, dict]) -> str:
    parts = []
    for name in ENVIRONMENT_SHOWN:
        values = sorted({str(row.get(name)) for row in rows.values() if row.get(name) is not None})
        if values:
            parts.append(f"{name} {', '.join(v[:12] if name == 'git_commit' else v for v in values)}")
    return "; ".join(parts)


def _finite(row: dict) -> bool:
    """A row whose time or loss is NaN/inf measured nothing to compare (never 'faster')."""
    median = row.get("median_ms")
    try:
        finite = median is not None and math.isfinite(float(median)) and float(median) > 0
    except (TypeError, ValueError):
        finite = False
    return finite and NONFINITE_LOSS_NOTE not in str(row.get("notes") or "")


def verdict(base: dict, new: dict, band_pct: float) -> tuple[float | None, str, bool]:
    """(ratio NEW/BASE of median time, verdict, is a regression)."""
    if base["status"] != "ok" and new["status"] != "ok":
        return None, f"not comparable (base {base['status']}, new {new['status']})", False
    if new["status"] != "ok":
        return None, f"REGRESSION: now {new['status']} (base ran)", True
    if base["status"] != "ok":
        return None, f"fixed: base {base['status']}, new runs", False
    if not _finite(new):
        return None, "REGRESSION: new row is NaN (time or loss)", True
    if not _finite(base):
        return None, "not comparable: base row is NaN (time or loss)", False
    claim = versus(new, base)
    if claim is not None and claim.verdict == NOT_COMPARED:
        return None, f"not compared ({claim.why_not})", False
    ratio = claim.ratio if claim is not None else new["median_ms"] / base["median_ms"]
    said = f" ({claim.caveat})" if claim is not None and claim.caveat else ""
    said += " (no spread recorded: not checked against the noise)" if claim is None else ""
    if abs(ratio - 1) <= band_pct / 100:
        return ratio, f"same (within ±{band_pct:g}%){said}", False
    if claim is not None and claim.verdict != RESOLVED:
        return ratio, f"cannot tell, ±{claim.half_width_pct:.0f}%{said}", False
    if ratio > 1:
        return ratio, f"SLOWER by {100 * (ratio - 1):.1f}% (> {band_pct:g}%){said}", True
    return ratio, f"faster by {100 * (1 - ratio):.1f}%{said}", False


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument(
        "--fail-above",
        type=positive_float,
        metavar="PCT",
        help="exit 1 if any matched row is slower by more than PCT percent",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    base, new = _rows(args.base), _rows(args.new)
    band = args.fail_above if args.fail_above is not None else DEFAULT_BAND_PCT

    table, regressions = [], 0
    for key in [k for k in base if k in new]:
        ratio, text, regressed = verdict(base[key], new[key], band)
        regressions += regressed
        b, n = base[key], new[key]
        table.append(
            [
                *(n.get(name) for name in SHOWN),
                b.get("median_ms"),
                n.get("median_ms"),
                None if ratio is None else f"{ratio:.3f}",
                text,
            ]
        )
    headers = [*SHOWN, "base_median_ms", "new_median_ms", "new/base", "verdict"]
    print(f"# {args.new} vs {args.base}\n")
    for side, rows in (("base", base), ("new", new)):
        print(f"- {side}: {len(rows)} rows; {environment_summary(rows)}. {describe_rows(list(rows.values()))}")
    print()
    print(tabulate(table, headers=headers, tablefmt="github", floatfmt=".3f") if table else "No matching rows.")
    for side, only in (("base", [k for k in base if k not in new]), ("new", [k for k in new if k not in base])):
        if only:
            print(f"\nOnly in {side} ({len(only)}, not compared):")
            rows = base if side == "base" else new
            for key in only:
                print("- " + " ".join(f"{name}={rows[key].get(name)}" for name in SHOWN))
    withheld = sum(1 for row in table if str(row[-1]).startswith("not compared ("))
    said = f", {withheld} not compared" if withheld else ""
    print(f"\n{len(table)} matched, {regressions} regression(s) beyond {band:g}%{said}.")
    return 1 if args.fail_above is not None and regressions else 0


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
