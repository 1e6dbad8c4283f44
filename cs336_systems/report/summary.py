"""The write-up's first page: what was measured, where and with what (machine, device, torch,
commit, scale), which results came from elsewhere, and a checklist of every problem of the edition
(measured, reduced, partly or not measured, with the reason).

Its two tables are not one row per cell (a column per machine, a line per problem), so their spec
names the function that rebuilds them from the result files (REBUILD), and `--verify` compares."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from ..editions import IMPLEMENTATION, OFFICIAL_TESTS, PROBLEM_KIND, PROBLEMS
from .document import Section, Table, Text
from .grid import Spec

ENVIRONMENT = (  # row label -> column of the result rows
    ("device", "device_name"),
    ("CPU", "cpu_name"),
    ("device memory", "device_memory_bytes"),
    ("threads", "num_threads"),
    ("torch", "torch_version"),
    ("CUDA", "cuda_version"),
    ("Python", "python_version"),
    ("commit", "git_commit"),
)


def _text(column: str, value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value == "":
        return ""
    if column == "device_memory_bytes":
        return f"{float(value) / 2**30:.1f} GiB"
    if column == "git_commit":
        return str(value)[:10]
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def environment_frame(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One column per (device, commit, torch) found; each field's distinct values, in file order."""
    rows = [f for f in frames.values() if "device_name" in f.columns and "torch_version" in f.columns]
    if not rows:
        return pd.DataFrame()
    every = pd.concat(rows, ignore_index=True)
    keys = [k for k in ("device_name", "git_commit", "torch_version") if k in every.columns]
    columns: dict[str, dict[str, str]] = {}
    for number, (_, group) in enumerate(every.groupby(keys, dropna=False, sort=False), 1):
        cells = {}
        for label, column in ENVIRONMENT:
            if column in group.columns:
                cells[label] = ", ".join(dict.fromkeys(t for t in (_text(column, v) for v in group[column]) if t))
        files = list(dict.fromkeys(str(s) for s in group["source"]))
        cells["result files"] = ", ".join(files) if len(files) <= 3 else f"{len(files)} files"
        columns[f"machine {number}"] = cells
    frame = pd.DataFrame(columns).fillna("")
    frame = frame[frame.apply(lambda r: r.ne("").any(), axis=1)]
    frame.index.name = "field"
    return frame


def problem_status(label: str, steps: list[dict]) -> tuple[str, str]:
    """(status, why) of one problem from its steps' outcomes."""
    kind = PROBLEM_KIND[label]
    if kind == IMPLEMENTATION:
        return "code", f"checked by the official tests: uv run pytest {OFFICIAL_TESTS[label]}"
    if kind != "measured":
        return "derivation", "the student's calculation: nothing to measure"
    if not steps:
        return "not measured", "not in this plan (--problems)"
    outcomes = [str(s.get("outcome")) for s in steps]
    skipped = [s for s in steps if str(s.get("outcome")) == "skipped"]
    why = list(dict.fromkeys(str(s.get("reason") or "").rstrip(".") for s in skipped))
    why += list(
        dict.fromkeys(
            str(s["reductions"]).rstrip(".") for s in steps if isinstance(s.get("reductions"), str) and s["reductions"]
        )
    )
    if any(o not in ("ok", "skipped", "failed rows") for o in outcomes):
        status = "not finished"
        why = [
            f"{s['step']}: {s['outcome']}"
            for s in steps
            if str(s.get("outcome")) not in ("ok", "skipped", "failed rows")
        ] + why
    elif all(o == "skipped" for o in outcomes):
        status = "not measured"
    elif "failed rows" in outcomes:
        status = "measured, some rows failed"
    elif skipped:
        status = "partly measured"
    elif any(isinstance(s.get("reductions"), str) and s["reductions"] for s in steps):
        status = "reduced"
    else:
        status = "measured"
    return status, "; ".join(w for w in why if w)


def checklist_frame(plan: pd.DataFrame) -> pd.DataFrame:
    edition = str(plan["edition"].iloc[0]).split(".")[0]
    records = plan.astype(object).where(plan.notna(), None).to_dict("records")
    body = []
    for label in PROBLEMS.get(edition, ()):
        status, why = problem_status(label, [r for r in records if r["problem"] == label])
        body.append({"problem": label, "status": status, "why": why})
    return pd.DataFrame(body).set_index("problem")


def plan_of(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return next(f for f in frames.values() if "plan_status" in f.columns)


REBUILD: dict[str, Callable[[dict[str, pd.DataFrame]], pd.DataFrame]] = {
    "environment": environment_frame,
    "checklist": lambda frames: checklist_frame(plan_of(frames)),
}


def environment_table(frames: dict[str, pd.DataFrame]) -> Table:
    """Where the rows of `frames` (by file name) were measured: a column per machine, commit and torch."""
    title, caption = "Where the results were measured", "One column per machine, commit and torch version"
    return rebuilt_table("environment", "environment", title, caption, frames)


def rebuilt_table(name: str, kind: str, title: str, caption: str, frames: dict[str, pd.DataFrame]) -> Table:
    """A table whose spec names the function that rebuilds it from its source files (`--verify`)."""
    frame = REBUILD[kind](frames)
    spec = Spec(f"rebuild:{kind}", list(frames), {}, [], [])
    return Table(name, title, caption, frame, spec=spec)


def first_page(plan: pd.DataFrame, files: dict[str, pd.DataFrame], problems: dict, plan_name: str) -> Section:
    first = plan.iloc[0]
    scale, device = str(first["scale"]), str(first.get("device_name"))
    section = Section("What was measured, where", None, page_break=True)
    text = (
        f"The {first['edition']} edition of the handout, planned for {device}"
        f"{' (assumed)' if str(first.get('device_assumed')) == 'True' else ''} at the {scale} scale. "
        "Every number in a table below is one measured row of the result files beside this write-up "
        "(`cs336-bench report --verify` re-derives each from them); the observations under each table are "
        "computed from those rows."
    )
    if scale == "small":
        text += (
            " Small scale: every model, attention and all-reduce shape is shrunk so that a CPU runs the whole plan "
            "in minutes; the numbers test the pipeline and are not the handout's answers at its shapes."
        )
    section.add(Text(text))
    used = {name: frame for name, frame in files.items() if "device_name" in frame.columns}
    section.add(environment_table(used))
    machines = environment_frame(used).shape[1] if used else 0
    section.add(
        Text(
            "Every result comes from one machine, commit and torch version."
            if machines <= 1
            else f"The results come from {machines} machines, commits or torch versions: each table's caption names its file, and the table above says which file came from where."
        )
    )
    section.add(
        rebuilt_table(
            "checklist",
            "checklist",
            "Every problem of the edition",
            "measured / reduced (smaller or fewer than the handout asks) / partly or not measured, with the reason",
            {plan_name: files[plan_name]},
        )
    )
    return section
