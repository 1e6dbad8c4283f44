"""The write-up of a handout plan (handout_plan.csv): a first page saying what was measured where with
a checklist of every problem, then one section per problem of the edition in the handout's order
(each problem writes its own: problems/), then the plan itself with every step's command.

The checklist is a result file of its own (handout_checklist.csv: a row per problem, from its steps'
outcomes), written beside the plan before the document is made, so `report --verify` checks its table
as any other."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..contention import describe_rows
from ..report.document import Bullets, Document, Section, Text
from ..report.grid import FoldedRows, Value, grid
from ..report.load import index_files, read_file
from ..report.summary import environment_frame, environment_table
from ..results import write_whole
from ..results.origin import named
from .problems import EDITIONS, IMPLEMENTATION, MEASURED, PROBLEMS, of_edition
from .problems.base import Results, letters_of


def build_writeup(
    plan: pd.DataFrame, plan_path: Path, out_dir: Path, stem: str, paragraphs: list[str]
) -> tuple[Document, list[str]]:
    """The write-up's document, and one line per expected result file that is missing."""
    plan = plan.sort_values("order") if "order" in plan.columns else plan
    edition = str(plan["edition"].iloc[0]).split(".")[0]
    directory = plan_path.parent
    files, missing = index_files(plan, directory)
    files[plan_path.name] = plan.assign(source=plan_path.name)
    checklist = directory / CHECKLIST_FILE
    if checklist.is_file():
        files[CHECKLIST_FILE] = read_file(checklist).assign(source=CHECKLIST_FILE)
    results: dict[str, Results] = {}
    for problem in of_edition(edition) if edition in EDITIONS else []:
        steps = [s for s in plan.to_dict("records") if s["problem"] == problem.label]
        results[problem.label] = Results(problem, edition, steps, directory, out_dir, stem, files, results)
    sections = []
    for answer in results.values():
        if answer.problem.kind == MEASURED and not answer.steps:
            sections.append(left_out(answer))
        else:
            sections.append(answer.problem.write(answer))
    title = f"CS336 assignment 2 (systems): write-up, {edition} edition"
    front = first_page(plan, files, plan_path.name)
    sections = [front, *sections, plan_appendix(plan, plan_path.name)]
    return Document(title, paragraphs, sections), missing


def left_out(results: Results) -> Section:
    return Section(f"{results.label}: {results.title}", results.label).add(
        Text(
            "Not measured: this plan left it out (--problems). "
            f"`cs336-bench handout --edition {results.edition} --problems {results.label}` measures it."
        )
    )


def plan_appendix(plan: pd.DataFrame, source: str) -> Section:
    """Every step of the plan: outcome, prediction against what it took, and its command."""
    frame = plan.assign(source=source)
    table = grid(
        frame,
        "handout",
        title="Every step of the plan",
        caption="Predictions are rough (time from FLOPs at a fixed share of the device's peak, memory from the "
        "estimator); outcomes and times are measured",
        labels=[("problem", "problem"), ("step", "step")],
        values=[
            Value("outcome", "outcome", "text"),
            Value("predicted peak", "predicted_peak_bytes", "bytes"),
            Value("predicted time", "predicted_s", "s"),
            Value("took", "elapsed_s", "s"),
        ],
    )
    commands = [
        f"{row['step']}: `{row['command']}`"
        for row in plan.to_dict("records")
        if isinstance(row.get("command"), str) and row["command"]
    ]
    section = Section("The plan and its commands", None, [table])
    section.add(
        Text("Each step's command, as run (outputs in this directory; `--resume` continues a sweep):"),
        Bullets(commands),
    )
    return section


# -- the first page -------------------------------------------------------------------------


def problem_status(label: str, steps: list[dict]) -> tuple[str, str]:
    """(status, why) of one problem from its steps' outcomes."""
    problem = PROBLEMS[label]
    if problem.kind == IMPLEMENTATION:
        return "code", f"checked by the official tests: uv run pytest {problem.official_test}"
    if problem.kind != MEASURED:
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


def part_statuses(label: str, edition: str, steps: list[dict]) -> str:
    """Each lettered sub-question's status: the student's (code, a derivation), or as the steps that
    name its letter ran (measured, reduced, not measured); a letter no step names is not measured here
    (Nsight's own figures without Nsight Systems), and its section says so."""
    words = []
    for part in PROBLEMS[label].parts_in(edition):
        if not part.letter:
            continue
        if part.answer in ("code", "derivation"):
            words.append(f"{part.letter} student's")
            continue
        named = [s for s in steps if part.letter in letters_of(str(s.get("part") or ""))]
        done = [s for s in named if str(s.get("outcome")) in ("ok", "failed rows")]
        if not named or not done:  # no step of the plan answers it here (its section says why)
            status = "not measured"
        elif any(isinstance(s.get("reductions"), str) and s["reductions"] for s in done):
            status = "reduced"
        else:
            status = "measured"
        words.append(f"{part.letter} {status}")
    return "; ".join(words)


def checklist_frame(plan: pd.DataFrame) -> pd.DataFrame:
    edition = str(plan["edition"].iloc[0]).split(".")[0]
    records = plan.astype(object).where(plan.notna(), None).to_dict("records")
    body = []
    for label in EDITIONS.get(edition, ()):
        steps = [r for r in records if r["problem"] == label]
        status, why = problem_status(label, steps)
        parts = part_statuses(label, edition, steps)
        if status in ("measured", "reduced") and "not measured" in parts:  # a letter no step answers here
            status = "partly measured"
        unanswered = [word.split()[0] for word in parts.split("; ") if word.endswith("not measured")]
        if not why and unanswered:  # the section says why, beside the letter
            why = f"({', '.join(unanswered)}) not measured here: its section says why and how to measure it"
        elif not why:
            why = "nothing left out"
        body.append({"problem": label, "status": status, "sub-questions": parts, "why": why})
    return pd.DataFrame(body).set_index("problem")


CHECKLIST_FILE = "handout_checklist.csv"


def write_checklist(plan: pd.DataFrame, directory: Path) -> Path:
    """The checklist's rows, beside the plan: the write-up's first table is made from them."""
    rows = checklist_frame(plan).reset_index().to_dict("records")
    path = directory / CHECKLIST_FILE
    write_whole(path, pd.DataFrame(named("handout_checklist", rows)).to_csv(index=False))
    return path


def checklist_table(frame: pd.DataFrame):
    return grid(
        frame,
        "handout_checklist",
        title="Every problem of the edition",
        caption="measured / reduced (smaller or fewer than the handout asks) / partly or not measured, with the "
        "reason; each sub-question: measured, reduced, not measured, or the student's (code, a derivation)",
        labels=[("problem", "problem")],
        values=[Value(header, header, "text") for header in ("status", "sub-questions", "why")],
        keep_empty=True,
    )


def first_page(plan: pd.DataFrame, files: dict[str, pd.DataFrame], plan_name: str) -> Section:
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
    rows = [row for frame in used.values() for row in frame.to_dict("records")]
    section.add(Text(describe_rows(rows)))
    section.add(environment_table(used))
    machines = environment_frame(used).shape[1] if used else 0
    section.add(
        Text(
            "Every result comes from one machine, commit and torch version."
            if machines <= 1
            else f"The results come from {machines} machines, commits or torch versions: each table's caption names its file, and the table above says which file came from where."
        )
    )
    if CHECKLIST_FILE in files:
        section.add(checklist_table(files[CHECKLIST_FILE]))
    return section


def write_up(directory: Path, paragraphs: list[str], formats: list[str]) -> list[str]:
    """The write-up of the plan in `directory`: its checklist, then writeup.{formats} (.md first, the
    smallest) beside the results. One line per problem: a result file the plan names and that is not
    there, or an output that could not be written."""
    from ..report import plots
    from ..report.cli import write
    from .run import PLAN_FILE

    plan_path = directory / PLAN_FILE
    plan = read_file(plan_path)
    write_checklist(plan, directory)
    plots.UNWRITTEN.clear()
    try:
        document, problems = build_writeup(plan, plan_path, directory, WRITEUP, paragraphs)
    except FoldedRows as exc:
        return [exc.said()]
    for suffix in sorted(formats, key=lambda s: s != ".md"):
        try:
            write(document, directory / f"{WRITEUP}{suffix}", tables_only=False)
        except OSError as exc:
            problems.append(f"{directory / f'{WRITEUP}{suffix}'}: could not be written ({exc.strerror or exc})")
    return problems + list(plots.UNWRITTEN)


WRITEUP = "writeup"  # OUTPUT_DIR/writeup.{md,tex,typ,pdf} and its figures writeup_*.png
