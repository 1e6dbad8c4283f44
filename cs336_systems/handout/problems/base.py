"""A handout problem is one object: what it asks for (measured, an implementation the official tests
check, a derivation), its title, its official test, how the plan measures it and how the write-up
answers it from the rows its steps wrote.

`Results` is one problem's side of the write-up: its plan rows (steps) and the rows of the files
they wrote. The helpers below give every section the same ending: what was reduced, and what was
not measured, why, and the command that measures it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ...report.document import Bullets, Heading, Section, Text
from ...report.load import reads, tool_of
from ..parameters import Options
from ..plan import Step
from ..target import Target
from .parts import PARTS, Part

# What a problem asks for: `measured` (the plan runs something for it), `implementation` (code the
# official tests check: nothing to measure), `analytic` (the student derives it on paper).
MEASURED, IMPLEMENTATION, ANALYTIC = "measured", "implementation", "analytic"
KIND_MEANING = {
    IMPLEMENTATION: "an implementation the official tests check",
    ANALYTIC: "a derivation on paper",
    MEASURED: "measured by the plan",
}


@dataclass(frozen=True)
class Problem:
    """One problem of the handout. `plan` makes its steps for an edition and a device; `write` its
    write-up section from its results (None: the kind's own section, see `section_of`)."""

    label: str
    title: str
    kind: str = MEASURED
    official_test: str | None = None  # `uv run pytest ...` arguments, as the handout gives them
    plan: Callable[[Options, Target], list[Step]] | None = None
    write: Callable[[Results], Section] | None = None
    titles: Mapping[str, str] = field(default_factory=dict)  # an edition whose handout titles it otherwise

    def title_in(self, edition: str) -> str:
        return self.titles.get(edition, self.title)

    def parts_in(self, edition: str) -> tuple[Part, ...]:
        """The handout's sub-questions of this problem in `edition` (parts.py)."""
        return PARTS.get(edition, {}).get(self.label, ())


@dataclass
class Results:
    """One problem of the plan in the write-up: its steps (plan rows) and the rows of the files they wrote."""

    problem: Problem
    edition: str
    steps: list[dict]
    directory: Path  # the plan's directory: the steps' outputs are there
    out_dir: Path  # where figures of the write-up go
    stem: str
    files: dict[str, pd.DataFrame] = field(default_factory=dict)  # file name -> rows (with `source`)
    others: dict[str, Results] = field(default_factory=dict, repr=False)  # every problem's, by label

    @property
    def label(self) -> str:
        return self.problem.label

    @property
    def title(self) -> str:
        return self.problem.title_in(self.edition)

    def other(self, label: str) -> Results | None:
        """Another problem's results, where a section compares with them (None when not in the plan)."""
        return self.others.get(label)

    def step(self, contains: str) -> dict | None:
        return next((s for s in self.steps if contains in str(s["step"])), None)

    def rows(self, tool: str, contains: str = "") -> pd.DataFrame:
        """The rows `tool` wrote for the steps whose id contains `contains`, from every file they read."""
        frames = []
        names = [name for step in self.steps if contains in str(step["step"]) for name in reads(step)]
        for name in dict.fromkeys(names):  # a file two steps read (the one baseline) once
            frame = self.files.get(name)
            if frame is not None and not frame.empty and tool_of(frame) == tool:
                frames.append(frame)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def not_measured(results: Results) -> list[str]:
    """One line per step that did not run or did not finish: why, and the command that measures it."""
    lines = []
    # on a GPU node, from the repository's root, the handout's own shapes: the problem's full plan
    to_measure = (
        f" To measure it on a GPU: `cs336-bench handout --edition {results.edition} --problems {results.label}`."
    )
    for step in results.steps:
        outcome = str(step.get("outcome"))
        if outcome in ("skipped", "over budget"):
            lines.append(f"{_part(step)}: not measured here: {_reason(step)}.{to_measure}")
        elif outcome not in ("ok", "failed rows"):
            lines.append(f"{_part(step)}: {outcome} (log: logs/{step['step']}.log).{to_measure}")
        elif outcome == "failed rows":
            lines.append(
                f"{_part(step)}: some rows failed; they are marked in the tables (log: logs/{step['step']}.log)."
            )
    return lines


def reductions(results: Results) -> list[str]:
    return [
        f"{_part(s)}: {s['reductions']}."
        for s in results.steps
        if isinstance(s.get("reductions"), str) and s["reductions"]
    ]


def _part(step: dict) -> str:
    return str(step.get("part") or step["step"]).rstrip(".")


def _reason(step: dict) -> str:
    return str(step.get("reason") or "no reason recorded").rstrip(".")


def section(results: Results) -> Section:
    return Section(f"{results.label}: {results.title}", results.label)


_LEADING_LETTERS = re.compile(r"^\s*\(([a-z](?:\s*[-–,]\s*[a-z])*)\)\s*,?\s*")


def letters_of(text: str) -> set[str]:
    """The sub-question letters a heading or line starts with: '(a), (e) ...', '(a-c, e) ...', '(b) ...'."""
    found: set[str] = set()
    while match := _LEADING_LETTERS.match(text):
        for piece in re.split(r"\s*,\s*", match.group(1)):
            ends = re.split(r"\s*[-–]\s*", piece)
            found |= {chr(c) for c in range(ord(ends[0]), ord(ends[-1]) + 1)}
        text = text[match.end() :]
    return found


def _texts(out: Section, observed: bool = False) -> list[str]:
    """The section's headings and lines (only its observations: what its rows say)."""
    blocks = [b for b in out.blocks if not observed or getattr(b, "spec", None) is not None]
    texts = [b.text for b in blocks if isinstance(b, (Heading, Text))]
    return texts + [item for b in blocks if isinstance(b, Bullets) for item in b.items]


def answered(out: Section) -> set[str]:
    """The letters a section's headings and lines name."""
    return set().union(*(letters_of(text) for text in _texts(out)))


UNANSWERABLE = ("cannot be compared", "not compared")  # a line of a section that answers nothing from its rows


def cannot_answer(out: Section) -> set[str]:
    """The letters that only observations saying the rows cannot answer them name (nsys (e) where the
    profiled operators hold no softmax to compare): never 'measured' in the checklist."""
    texts = _texts(out, observed=True)
    unable = [t for t in texts if any(words in t for words in UNANSWERABLE)]
    return set().union(*map(letters_of, unable)) - set().union(*(letters_of(t) for t in texts if t not in unable))


def unanswered(results: Results, out: Section) -> list[str]:
    """One line for each sub-question the section does not name yet: the student's (code, a derivation),
    or not measured by this plan (a measurement), with the command that measures the problem."""
    named = answered(out)
    lines = []
    for part in results.problem.parts_in(results.edition):
        if not part.letter or part.letter in named:
            continue
        head = f"({part.letter}) {part.asks}:"
        if part.answer == "code":
            lines.append(f"{head} the student's own code; the official tests check it.")
        elif part.answer == "derivation":
            lines.append(f"{head} the student's own answer, on paper.")
        elif part.letter in gpu_plan_letters(results.edition, results.label):
            command = f"cs336-bench handout --edition {results.edition} --problems {results.label}"
            lines.append(f"{head} not measured by this plan; on a GPU, `{command}` measures it.")
        else:
            lines.append(
                f"{head} not measured by this tool on any device: the student's own (a profile they take and read)."
            )
    return lines


@functools.cache
def handout_plan(edition: str, label: str) -> tuple[Step, ...]:
    """The steps of `label`'s plan for a node of H100s at the handout's scale: what the handout asks of it
    (its all-reduce runs up to 6 ranks)."""
    from ..parameters import FULL
    from ..target import assumed_target
    from . import PROBLEMS

    problem = PROBLEMS[label]
    return tuple(problem.plan(Options(edition, FULL, "cuda"), assumed_target("8x H100 80GB"))) if problem.plan else ()


def gpu_plan_letters(edition: str, label: str) -> frozenset[str]:
    """The sub-question letters the handout's plan of `label` names: what the command a section points to
    on a GPU would measure."""
    return frozenset().union(*(letters_of(step.part) for step in handout_plan(edition, label)))


def finish(results: Results, out: Section) -> Section:
    """The lines every section ends with: each sub-question not named yet, what was reduced, and
    what was not measured, why, and the command that measures it."""
    lines = unanswered(results, out) + reductions(results) + not_measured(results)
    if lines:
        out.add(Bullets(lines))
    return out
