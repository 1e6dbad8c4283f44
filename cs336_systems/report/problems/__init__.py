"""The write-up of a handout plan: one section per problem of the edition, in the handout's order.

A measured problem's section shows, part by part, the tables and figures its deliverable asks
for (built from the rows of its steps' result files), observations computed from those rows, and
for each part not measured here one line saying why with the command that measures it. An
implementation problem points at the official tests; a derivation is the student's, with the
measured rates it may use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ...editions import OFFICIAL_TESTS, problem_title
from ..document import Bullets, Section, Text
from ..load import read_file, tool_of


@dataclass
class Problem:
    """One problem of the plan: its steps (plan rows) and the rows of the files they wrote."""

    label: str
    edition: str
    steps: list[dict]
    directory: Path  # the plan's directory: the steps' outputs are there
    out_dir: Path  # where figures of the write-up go
    stem: str
    files: dict[str, pd.DataFrame] = field(default_factory=dict)  # file name -> rows (with `source`)

    @property
    def title(self) -> str:
        return problem_title(self.label, self.edition)

    def step(self, contains: str) -> dict | None:
        return next((s for s in self.steps if contains in str(s["step"])), None)

    def rows(self, tool: str, contains: str = "") -> pd.DataFrame:
        """The rows `tool` wrote for the steps whose id contains `contains`, from every file they read."""
        frames = []
        for step in self.steps:
            if contains not in str(step["step"]):
                continue
            for name in reads(step):
                frame = self.files.get(name)
                if frame is not None and not frame.empty and tool_of(frame) == tool:
                    frames.append(frame)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def reads(step: dict) -> list[str]:
    """The result files a step's rows are in: the plan's `reads`, else its CSV outputs; a JSONL beside
    a CSV is read instead (it keeps each step's samples, so per-phase spreads can be shown)."""
    names = _words(step.get("reads")) or [n for n in _words(step.get("outputs")) if n.endswith((".csv", ".json"))]
    return list(dict.fromkeys(names))


def _words(value: object) -> list[str]:
    return value.split() if isinstance(value, str) else []  # an empty cell reads back as NaN


def load_files(plan: pd.DataFrame, directory: Path) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Every step's result files, by name (a JSONL instead of its CSV twin); and one line per file that
    a finished step should have written and did not."""
    files, problems = {}, []
    for step in plan.to_dict("records"):
        if step.get("outcome") not in ("ok", "failed rows"):
            continue
        for name in reads(step):
            path = directory / name
            twin = path.with_suffix(".jsonl")
            if path.suffix == ".csv" and twin.is_file():
                path = twin
            if not path.is_file():
                problems.append(f"{name}: named by step {step['step']} but not in {directory}")
                continue
            frame = read_file(path)
            files[name] = frame.assign(source=path.name)
    return files, problems


def not_measured(problem: Problem) -> list[str]:
    """One line per step that did not run or did not finish: why, and the command that measures it."""
    lines = []
    for step in problem.steps:
        outcome = str(step.get("outcome"))
        command = str(step.get("command") or "")
        to_measure = f" To measure it: `{command}`." if command and command != "nan" else ""
        if outcome == "skipped":
            lines.append(f"{_part(step)}: not measured here: {_reason(step)}.{to_measure}")
        elif outcome not in ("ok", "failed rows"):
            lines.append(f"{_part(step)}: {outcome} (log: logs/{step['step']}.log).{to_measure}")
        elif outcome == "failed rows":
            lines.append(
                f"{_part(step)}: some rows failed; they are marked in the tables (log: logs/{step['step']}.log)."
            )
    return lines


def reductions(problem: Problem) -> list[str]:
    return [
        f"{_part(s)}: {s['reductions']}."
        for s in problem.steps
        if isinstance(s.get("reductions"), str) and s["reductions"]
    ]


def _part(step: dict) -> str:
    return str(step.get("part") or step["step"]).rstrip(".")


def _reason(step: dict) -> str:
    return str(step.get("reason") or "no reason recorded").rstrip(".")


def implementation_section(problem: Problem) -> Section:
    tests = OFFICIAL_TESTS[problem.label]
    return Section(f"{problem.label}: {problem.title}", problem.label).add(
        Text(
            f"Code, not a measurement: the official tests check it (`uv run pytest {tests}`). Its speed and "
            "memory are measured in the benchmarking problems that follow."
        )
    )


def analytic_section(problem: Problem, rates: list[str]) -> Section:
    section = Section(f"{problem.label}: {problem.title}", problem.label)
    section.add(Text("A derivation, not a measurement: the student's to write. Not measured here."))
    if rates:
        section.add(Text(f"Measured here, should the calculation want them: {'; '.join(rates)}."))
    return section


def section(problem: Problem) -> Section:
    return Section(f"{problem.label}: {problem.title}", problem.label)


def finish(problem: Problem, out: Section) -> Section:
    """The lines every section ends with: what was reduced, what was not measured and why."""
    lines = reductions(problem) + not_measured(problem)
    if lines:
        out.add(Bullets(lines))
    return out
