"""The write-up of a handout plan (handout_plan.csv): a first page saying what was measured where with
a checklist of every problem, then one section per problem of the edition in the handout's order
(each problem writes its own: problems/), then the plan itself with every step's command.

The checklist is a result file of its own (handout_checklist.csv: a row per problem, from its steps'
outcomes against what the handout asks, and its section's answers), written beside the plan before the
first page is made, so `report --verify` checks its table as any other."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from ..contention import describe_rows
from ..report.document import Bullets, Document, Section, Text
from ..report.grid import FoldedRows, Value, grid
from ..report.load import index_files, read_file
from ..report.observe import observations
from ..report.summary import environment_frame, environment_table
from ..results import write_whole
from ..results.origin import named
from .problems import EDITIONS, IMPLEMENTATION, MEASURED, PROBLEMS, of_edition
from .problems.base import Results, cannot_answer, handout_plan, letters_of


def build_writeup(
    plan: pd.DataFrame, plan_path: Path, out_dir: Path, stem: str, paragraphs: list[str]
) -> tuple[Document, list[str]]:
    """The write-up's document, and one line per expected result file that is missing."""
    plan = plan.sort_values("order") if "order" in plan.columns else plan
    edition = str(plan["edition"].iloc[0]).split(".")[0]
    directory = plan_path.parent
    files, missing = index_files(plan, directory)
    files[plan_path.name] = plan.assign(source=plan_path.name)
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
    unable = {section.problem: cannot_answer(section) for section in sections}
    files[CHECKLIST_FILE] = read_file(write_checklist(plan, directory, unable)).assign(source=CHECKLIST_FILE)
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


# The flags that say how much a step measures (a singular form, --context-length, counts as its plural).
SHAPE_FLAGS = ("--model-sizes", "--context-lengths", "--head-dims", "--batch-sizes", "--warmup-steps")
SHAPE_FLAGS += ("--measure-steps", "--precisions", "--sizes", "--world-sizes", "--bucket-cap-mb", "--checkpoint-blocks")


def flags_of(command: str) -> dict[str, list[str]]:
    """A step's flags as its command line gives them."""
    flags: dict[str, list[str]] = {}
    key = None
    for token in shlex.split(command):
        key = token if token.startswith("--") else key
        flags.setdefault(key, []).extend([] if token.startswith("--") or key is None else [token])
    return flags


def measured(all_flags: list[dict]) -> dict[str, list[str]]:
    """What steps of these flags measure, by SHAPE_FLAGS (a model by its shape where one is given)."""
    found: dict[str, dict[str, None]] = {}
    for flags in all_flags:
        flags = {f"{k}s" if f"{k}s" in SHAPE_FLAGS else k: v if isinstance(v, list) else [v] for k, v in flags.items()}
        shape = [f"d_model {flags['--d-model'][0]}"] if "--d-model" in flags else []
        shape += [f"{flags['--num-layers'][0]} layers"] if "--num-layers" in flags else []
        for flag in SHAPE_FLAGS:
            values = [", ".join(shape)] if flag == "--model-sizes" and shape and flag in flags else flags.get(flag, [])
            found.setdefault(flag, {}).update(dict.fromkeys(str(v) for v in values))
    numeric = lambda text: (0, float(text)) if text.replace(".", "", 1).isdigit() else (1, 0.0)  # noqa: E731
    return {flag: sorted(values, key=numeric) for flag, values in found.items() if values}


def against_handout(label: str, edition: str, ran: list[dict]) -> str:
    """What the steps that ran measure other than the handout asks (its plan for H100s at its own scale),
    by SHAPE_FLAGS with the handout's values (a flag its plan leaves to the tool's default is not
    compared); '' where nothing differs."""
    asked = measured([step.flags for step in handout_plan(edition, label)])
    got = measured([flags_of(s["command"]) for s in ran if isinstance(s.get("command"), str)])
    differ = [f"{f} {' '.join(v)} (handout: {' '.join(asked[f])})" for f, v in got.items() if v != asked.get(f, v)]
    return f"less than the handout asks: {'; '.join(differ)}" if differ else ""


RAN = ("ok", "failed rows")


def problem_status(label: str, edition: str, steps: list[dict], unable: set[str]) -> dict[str, str]:
    """One checklist row: the problem's status and why from its steps' outcomes, what ran against what
    the handout asks, and each lettered sub-question's status (measured, reduced, not measured: no step
    answers it, or its section says the rows cannot; or the student's: code, a derivation)."""
    problem = PROBLEMS[label]
    if problem.kind == IMPLEMENTATION:
        status, why = "code", f"checked by the official tests: uv run pytest {problem.official_test}"
    elif problem.kind != MEASURED:
        status, why = "derivation", "the student's calculation: nothing to measure"
    elif not steps:
        status, why = "not measured", "not in this plan (--problems)"
    outcomes = [str(s.get("outcome")) for s in steps]
    reduced = [
        str(s["reductions"]).rstrip(".") for s in steps if isinstance(s.get("reductions"), str) and s["reductions"]
    ]
    against = against_handout(label, edition, [s for s in steps if str(s.get("outcome")) in RAN]) if steps else ""
    parts = []
    for part in (p for p in problem.parts_in(edition) if p.letter):
        done = [s for s in steps if part.letter in letters_of(str(s.get("part") or "")) and s.get("outcome") in RAN]
        if part.answer in ("code", "derivation"):
            parts.append(f"{part.letter} student's")
        elif not done or part.letter in unable:
            parts.append(f"{part.letter} not measured")
        else:
            parts.append(
                f"{part.letter} {'reduced' if against or any(s.get('reductions') for s in done) else 'measured'}"
            )
    if problem.kind == MEASURED and steps:
        failed = [f"{s['step']}: {o}" for s, o in zip(steps, outcomes) if o not in (*RAN, "skipped")]
        skipped = [str(s.get("reason") or "").rstrip(".") for s, o in zip(steps, outcomes) if o == "skipped"]
        unanswered = [word.split()[0] for word in parts if word.endswith("not measured")]
        status = (
            "not finished" if failed
            else "not measured" if all(o == "skipped" for o in outcomes)
            else "measured, some rows failed" if "failed rows" in outcomes
            else "partly measured" if skipped or unanswered
            else "reduced" if reduced or against
            else "measured"
        )  # fmt: skip
        notes = [f"({', '.join(unanswered)}) not measured here: its section says why"] if unanswered else []
        why = (
            "; ".join(dict.fromkeys(w for w in (*failed, *skipped, against, *reduced, *notes) if w))
            or "nothing left out"
        )
    return {"problem": label, "status": status, "sub-questions": "; ".join(parts), "why": why}


def checklist_frame(plan: pd.DataFrame, unable: dict[str, set[str]] | None = None) -> pd.DataFrame:
    edition = str(plan["edition"].iloc[0]).split(".")[0]
    records = plan.astype(object).where(plan.notna(), None).to_dict("records")
    body = [
        problem_status(label, edition, [r for r in records if r["problem"] == label], (unable or {}).get(label, set()))
        for label in EDITIONS.get(edition, ())
    ]
    return pd.DataFrame(body).set_index("problem")


CHECKLIST_FILE = "handout_checklist.csv"


def write_checklist(plan: pd.DataFrame, directory: Path, unable: dict[str, set[str]] | None = None) -> Path:
    """The checklist's rows, beside the plan: the write-up's first table is made from them."""
    rows = checklist_frame(plan, unable).reset_index().to_dict("records")
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
    section.add(observations(describe_rows, pd.concat(list(used.values()), ignore_index=True)))
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
