"""One row, one number: every value cell of a report table is one result row's field, picked by
the table row's labels and the column's keys, and the table carries the spec that lets
`report --verify` re-derive each cell from the result files alone.

A table is declared by its label columns (fields whose text names a table row), its value columns
(a field, a format, and the values of other fields that pick the row, as the fp32 and bf16 columns
of one table row do) and the rows behind it. An identity field of the tool that varies among those
rows and is neither a label nor a column key becomes a label column of its own, so two
configurations never share a cell; an identity field that does not vary is stated once, in the
caption. A ratio column divides two cells of the same table row, each one row's value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from ..results import plausibility
from ..results.plausibility import NOT_MEASURABLE
from ..stats import NOISE
from ..units import format_bytes
from .document import FAILURE_MARK, NOISY_MARK, Table, missing, plain, sig3, slug, times
from .fields import IDENTITY, LABEL_HEADERS, derive, label_text, sort_key
from .spec import Spec, Value

# -- formats: one function per way a number is shown, shared by the builder and --verify --------


def _number(row: dict, name: str) -> float | None:
    value = row.get(name)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _stats_prefix(name: str) -> str:
    """forward_mean_ms -> forward_; median_ms -> ''."""
    for statistic in ("mean_ms", "median_ms"):
        if name.endswith(statistic):
            return name.removesuffix(statistic)
    return name.removesuffix("ms")


def _noise_mark(row: dict, name: str, statistic: str) -> str:
    """† when the spread of the statistic shown (stats.NOISE: IQR/median, or the CV of a mean) is above the bar."""
    rule = NOISE[statistic]
    return f" {NOISY_MARK}" if rule.is_noisy(rule.spread_of(row, _stats_prefix(name))) else ""


def mean_std(row: dict, name: str) -> str:
    """'mean ± sample std' of a timing column (the handout asks for both), † by the CV."""
    mean = _number(row, name)
    if mean is None:
        return ""
    std = _number(row, f"{_stats_prefix(name)}std_ms")
    return sig3(mean) + ("" if std is None else f" ± {sig3(std)}") + _noise_mark(row, name, "mean")


def median(row: dict, name: str) -> str:
    """'median (IQR)' of a timing column (a *_median_ms field), † by IQR/median (torch.utils.benchmark's rule)."""
    value = _number(row, name)
    if value is None:
        return ""
    iqr = _number(row, f"{_stats_prefix(name)}iqr_ms")
    return sig3(value) + ("" if iqr is None else f" ({sig3(iqr)})") + _noise_mark(row, name, "median")


def _scaled(scale: float) -> Callable[[dict, str], str]:
    def show(row: dict, name: str) -> str:
        value = _number(row, name)
        return "" if value is None else sig3(value / scale)

    return show


def _percent_of_fraction(row: dict, name: str) -> str:
    value = _number(row, name)
    return "" if value is None else f"{100 * value:.1f}"


FORMATS: dict[str, Callable[[dict, str], str]] = {
    "sig3": lambda row, name: "" if (v := _number(row, name)) is None else sig3(v),
    "ms±": mean_std,  # a *_mean_ms field
    "ms": median,  # a *_median_ms field, with its IQR
    "GiB": _scaled(2**30),
    "MiB": _scaled(2**20),
    "KiB": _scaled(2**10),
    "GB/s": _scaled(1.0),
    "x100": _percent_of_fraction,  # a fraction (MFU, scaling efficiency) as a percentage
    "int": lambda row, name: "" if (v := _number(row, name)) is None else f"{v:,.0f}",
    "sci": lambda row, name: "" if (v := _number(row, name)) is None else f"{v:.1e}",
    "sci±": lambda row, name: "" if (v := _number(row, name)) is None else f"{v:+.1e}",
    "ms_from_ns": lambda row, name: "" if (v := _number(row, name)) is None else sig3(v / 1e6),
    "text": lambda row, name: plain(row.get(name)),
    "head": lambda row, name: head_of(plain(row.get(name))),  # a long description's first words; its whole below
    "bytes": lambda row, name: "" if (v := _number(row, name)) is None else format_bytes(v),
    "s": lambda row, name: "" if (v := _number(row, name)) is None else seconds_text(v),
}


def head_of(text: str) -> str:
    """A description's words before its first ' (' or ': ' ('step - no_sync step (exposed)' -> 'step -
    no_sync step'), for a narrow cell; the table says the whole text under it."""
    for stop in (" (", ": "):
        text = text.split(stop, 1)[0]
    return text


def seconds_text(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


def ratio_text(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None or denominator == 0:
        return ""
    return times(numerator / denominator)


def cell_text(row: dict, value: Value) -> str:
    """What a value cell shows for `row` (a failed row's status where it has no value; NOT_MEASURABLE
    where the value cannot be a result, results/plausibility.py)."""
    if value.field in plausibility.problems(row):
        return NOT_MEASURABLE
    text = FORMATS[value.fmt](row, value.field)
    if text == "" and row.get("status") not in (None, "ok"):
        return FAILURE_MARK.get(str(row["status"]), str(row["status"]))
    return text


# Aggregations over the rows of one run (the warmup study writes one row per step).
AGGREGATES: dict[str, Callable[[list[dict], str], str]] = {
    "mean±std": lambda rows, name: _agg_mean_std([_number(r, name) for r in rows]),
    "first": lambda rows, name: sig3(_number(rows[0], name)) if rows else "",
    "later": lambda rows, name: _agg_later([v for r in rows[1:] if (v := _number(r, name)) is not None]),
    "count": lambda rows, name: str(len(rows)),
}


def _agg_mean_std(values: list[float | None]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return ""
    series = pd.Series(values, dtype=float)
    std = series.std()
    return sig3(series.mean()) + ("" if missing(std) else f" ± {sig3(std)}")


def _agg_later(values: list[float]) -> str:
    """The steps after the first: their median and range, as the warmup study's sentences read them."""
    return f"{sig3(float(np.median(values)))} ({sig3(min(values))} to {sig3(max(values))})" if values else ""


def aggregate_text(rows: list[dict], value: Value) -> str:
    ordered = sorted(rows, key=lambda r: _number(r, value.over) or 0)
    return AGGREGATES[value.fmt](ordered, value.field)


# -- building ---------------------------------------------------------------------------------


def matches(row: dict, wanted: dict) -> bool:
    """Whether `row` reads as each of `wanted`'s label texts (the rows a spec's settings or keys pick)."""
    return all(label_text(name, row) == text for name, text in wanted.items())


def _text_frame(rows: list[dict], names: Sequence[str]) -> dict[str, set[str]]:
    return {name: {label_text(name, row) for row in rows} for name in names}


class FoldedRows(ValueError):
    """Two rows of one configuration landed in one cell: the table's declaration is wrong, or the
    rows were measured at the same moment too (a row written twice), which `said` puts to the user."""

    def said(self) -> str:
        return f"two rows of one configuration measured at the same moment ({self}): a row written twice? remove one"


def grid(
    frame: pd.DataFrame,
    tool: str,
    *,
    title: str,
    labels: Sequence[tuple[str, str]],
    values: Sequence[Value],
    caption: str = "",
    name: str | None = None,
    footnotes: Sequence[str] = (),
    keep_empty: bool = False,
) -> Table:
    """A table of `frame`'s rows (one tool's, with a `source` column naming their file). Rows of one
    configuration measured twice in one file are told apart by when they were measured."""
    try:
        return _grid(frame, tool, title, labels, values, caption, name, footnotes, keep_empty)
    except FoldedRows:
        if any(n == "timestamp" for _, n in labels) or "timestamp" not in frame.columns:
            raise
        return _grid(
            frame, tool, title, [*labels, ("measured at", "timestamp")], values, caption, name, footnotes, keep_empty
        )


def _grid(frame, tool, title, labels, values, caption, name, footnotes, keep_empty) -> Table:
    frame = derive(frame, tool)
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    keyed = {name for _, name in labels} | {k for v in values for k in (*v.where, *(v.ratio_to or {}))}
    keyed |= {v.over for v in values if v.over}
    open_fields = [n for n in IDENTITY[tool] if n not in keyed]
    texts = _text_frame(rows, open_fields)
    fixed = {n: next(iter(t)) for n, t in texts.items() if len(t) == 1}
    values, varying = _bind(rows, values, [n for n in open_fields if n not in fixed])
    taken = {h for h, _ in labels} | {v.header for v in values}
    extra = []
    for name in varying:  # a header names one column: a second 'device' is called by its field
        header = LABEL_HEADERS.get(name, name.replace("_", " "))
        header = name if header in taken else header
        taken.add(header)
        extra.append((header, name))
    labels = [*labels, *extra]
    label_names = [n for _, n in labels]
    groups: dict[tuple[str, ...], list[dict]] = {}
    first_seen = {n: {} for n in label_names}  # words sort as they first appear in the files
    for row in rows:
        for n in label_names:
            first_seen[n].setdefault(label_text(n, row), len(first_seen[n]))

    def order(row: dict) -> tuple:
        keys = [sort_key(n, row) for n in label_names]
        return tuple(
            (k[0], k[1] if k[0] == 0 else first_seen[n][label_text(n, row)], k[2])
            for n, k in zip(label_names, keys, strict=True)
        )

    for row in sorted(rows, key=order):
        groups.setdefault(tuple(label_text(n, row) for n in label_names), []).append(row)
    body = []
    for key, members in groups.items():
        cells = dict(zip([h for h, _ in labels], key, strict=True))
        for value in values:
            cells[value.header] = cell_value(members, value, key)
        body.append(cells)
    table = pd.DataFrame(body, columns=[h for h, _ in labels] + [v.header for v in values]).fillna("")
    if not keep_empty:  # a value column no row fills says nothing
        table = table[[c for c in table.columns if c in [h for h, _ in labels] or table[c].ne("").any()]]
    table = table.set_index(labels[0][0]) if labels else table
    shown = [v for v in values if v.header in table.columns]
    _rates_on_their_statistic(title, shown)
    sources = list(dict.fromkeys(str(s) for s in frame.get("source", pd.Series(dtype=object)).dropna()))
    spec = Spec(tool, sources, fixed, [tuple(x) for x in labels], shown, title, caption, list(groups))
    text = caption_text(caption, sources, fixed, tool)
    notes = [
        *footnotes,
        *_mark_footnotes(table, shown),
        *_failure_notes(rows, labels),
        *_implausible_notes(rows, labels, shown),
    ]
    return Table(slug(name or title), title, text, table, notes, spec=spec)


def _bind(rows: list[dict], values: Sequence[Value], candidates: list[str]) -> tuple[list[Value], list[str]]:
    """Split the fields that differ among the rows into those that differ within one column's rows
    (they must label table rows) and those that only tell columns apart (compile_mode differs between
    the eager and the compiled column, not within either): the latter join each column's keys."""
    groups = [
        [r for r in rows if matches(r, keys)] for v in values for keys in (v.where, v.ratio_to) if keys is not None
    ]
    varying = [n for n in candidates if any(len({label_text(n, r) for r in group}) > 1 for group in groups)]
    bound = [n for n in candidates if n not in varying]
    if not bound:
        return list(values), varying

    def pinned(keys: dict) -> dict:
        group = [r for r in rows if matches(r, keys)]
        return {**keys, **{n: label_text(n, group[0]) for n in bound}} if group else keys

    bound_values = [
        Value(v.header, v.field, v.fmt, pinned(v.where), None if v.ratio_to is None else pinned(v.ratio_to), v.over)
        for v in values
    ]
    return bound_values, varying


def cell_value(members: list[dict], value: Value, key: tuple) -> str:
    """The text of `value`'s cell from the rows of one table row (FoldedRows where two rows could fill it)."""
    picked = [r for r in members if matches(r, value.where)]
    if value.over:
        return aggregate_text(picked, value) if picked else ""
    if len(picked) > 1:
        raise FoldedRows(f"{value.header} at {key}: {len(picked)} rows")
    if not picked:
        return ""
    if value.ratio_to is None:
        return cell_text(picked[0], value)
    below = [r for r in members if matches(r, value.ratio_to)]
    if len(below) != 1:
        return ""
    if picked[0].get("status") != "ok" or below[0].get("status") != "ok":
        return ""
    if any(value.field in plausibility.problems(r) for r in (picked[0], below[0])):
        return NOT_MEASURABLE
    return ratio_text(_number(picked[0], value.field), _number(below[0], value.field))


STATISTIC_OF_FORMAT = {"ms": "median", "ms±": "mean"}  # the statistic a timing format shows (its noise rule's)


def _rates_on_their_statistic(title: str, values: Sequence[Value]) -> None:
    """A table that shows a rate beside timings shows the statistic the rate is computed on (a bug else)."""
    shown = {STATISTIC_OF_FORMAT[v.fmt] for v in values if v.fmt in STATISTIC_OF_FORMAT}
    if shown and plausibility.RATE_STATISTIC not in shown and any(plausibility.is_rate(v.field) for v in values):
        raise ValueError(
            f"{title!r} shows a rate beside {'/'.join(shown)} times: show its {plausibility.RATE_STATISTIC}"
        )


def _mark_footnotes(table: pd.DataFrame, values: Sequence[Value] = ()) -> list[str]:
    cells = {str(c) for c in table.to_numpy().ravel()}
    timed = [v for v in values if v.fmt in STATISTIC_OF_FORMAT and v.header in table.columns]
    marked = dict.fromkeys(
        STATISTIC_OF_FORMAT[v.fmt] for v in timed if any(NOISY_MARK in str(c) for c in table[v.header])
    )
    notes = [f"{NOISY_MARK} {NOISE[statistic].footnote}" for statistic in marked]
    shown = [f"{mark}: {MARK_WORDS[status]}" for status, mark in FAILURE_MARK.items() if mark in cells]
    if shown:
        notes.append("; ".join(shown) + ".")
    return notes


def _row_name(row: dict, labels: Sequence[tuple[str, str]]) -> str:
    """A row as its table's label columns name it, a bare number with its header ('flash-pytorch d 16 seq 64')."""
    words = []
    for header, name in labels:
        text = label_text(name, row)
        if text:
            words.append(f"{header} {text}" if text[:1].isdigit() else text)
    return " ".join(words)


def _naming(rows: list[dict], labels: Sequence[tuple[str, str]]) -> Sequence[tuple[str, str]]:
    """The fewest leading label columns that tell the table's rows apart (a note names its rows by them)."""
    for count in range(1, len(labels) + 1):
        names = [_row_name(row, labels[:count]) for row in rows]
        if len(set(names)) == len(names):
            return labels[:count]
    return labels


def _failure_notes(rows: list[dict], labels: Sequence[tuple[str, str]]) -> list[str]:
    """Why each row that did not run is marked so, said once per reason (the row's own error text)."""
    reasons: dict[str, list[str]] = {}
    naming = _naming(rows, labels)
    for row in rows:
        error = row.get("error")
        if row.get("status") not in (None, "ok") and isinstance(error, str) and error:
            reasons.setdefault(f"{row['status']}: {error.splitlines()[0][:200]}", []).append(_row_name(row, naming))
    return [f"{'; '.join(dict.fromkeys(who))}: {why}." for why, who in reasons.items()]


def _implausible_notes(rows: list[dict], labels: Sequence[tuple[str, str]], values: Sequence[Value]) -> list[str]:
    """Why a cell shows NOT_MEASURABLE, once per reason, naming its rows."""
    shown = {v.field for v in values}
    reasons: dict[str, list[str]] = {}
    naming = _naming(rows, labels)
    for row in rows:
        for name, why in plausibility.problems(row).items():
            # a value computed from another (comm_pct from comm_ms) is unusable for the same reason: said once
            why = why.removeprefix(f"from {plausibility.DEPENDS_ON.get(name)}: ")
            if name in shown:
                reasons.setdefault(why, []).append(_row_name(row, naming))
    return [f"{NOT_MEASURABLE}: {'; '.join(dict.fromkeys(who))}: {why}." for why, who in reasons.items()]


MARK_WORDS = {
    "oom": "out of memory",
    "error": "failed (why: below)",
    "timeout": "over its time limit",
    "unsupported": "not supported on this machine",
    "skipped": "not run (why: below)",
}


def caption_text(caption: str, sources: Sequence[str], fixed: dict, tool: str) -> str:
    from .fields import describe_fixed

    parts = [caption.rstrip(".") + "." if caption else ""]
    setting = describe_fixed(fixed, tool)
    if setting:
        parts.append(f"Every row: {setting}.")
    if sources:
        parts.append(f"Source: {', '.join(sources)}.")
    return " ".join(p for p in parts if p)
