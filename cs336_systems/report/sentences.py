"""`report --verify`'s check of the sentences. Each observation of a write-up (a paragraph or a list
after its `<!-- claims {...} -->` spec, observe.observations) is said again by the maker its spec names,
from the rows of the files it names, written by the report's own Markdown writer, and compared line by
line: a number, a direction or a word that differs is a failure, and so is a spec that names no maker or
file given. A sentence in the claims' words (a ranking, "the same within", the machine's load) that no
spec covers is refused too: it was not made from the rows."""

from __future__ import annotations

import json
import re

import pandas as pd

from .document import Bullets, Text
from .markdown import sentences_markdown
from .spec import CLAIMS_MARK, MAX_SPEC_DEPTH, nesting_depth

_COMMENT = re.compile(rf"^<!-- {CLAIMS_MARK} (.*) -->$")
# The renderer's own words (observe.say, contention.describe_rows): a sentence using them is a claim.
CLAIM_WORDS = re.compile(r" as fast| the same within|cannot tell|not compared|cores busy|machine was quiet", re.I)


def said_again(text: str, frames: dict[str, pd.DataFrame]) -> list[str]:
    """The lines the observation spec `text` describes, made again from the files' rows (ValueError: why not)."""
    from ..handout import problems  # noqa: F401  (their makers register on import)
    from . import build  # noqa: F401
    from .observe import MAKERS, claim_rows

    try:
        if (depth := nesting_depth(text)) > MAX_SPEC_DEPTH:
            raise ValueError(f"its claims spec is nested {depth} deep (a spec is at most {MAX_SPEC_DEPTH})")
        spec = json.loads(text.replace("-\\u002d", "--"))
        if missing := [s for s in spec["sources"] if s not in frames] or ([] if spec["sources"] else ["(none)"]):
            raise ValueError(f"its source {missing[0]} is not among the result files given")
        frame = pd.concat([frames[s] for s in spec["sources"]], ignore_index=True)
        said = MAKERS[spec["maker"]](claim_rows(frame, spec["tool"], spec["where"]), **spec["args"])
    except (TypeError, KeyError, AttributeError) as exc:  # a spec edited by hand
        raise ValueError(f"its claims spec cannot be applied ({type(exc).__name__}: {exc})") from None
    return [line for line in sentences_markdown(Text(said) if isinstance(said, str) else Bullets(said)) if line]


def check_sentences(text: str, frames: dict[str, pd.DataFrame]) -> tuple[int, list[str]]:
    """(observations checked, failures): each observation against the one its rows make, and each other
    line of prose (not a table, heading or comment) that says a claim."""
    lines, problems, checked, index = text.splitlines(), [], 0, 0
    while index < len(lines):
        line = lines[index].strip()
        if not (match := _COMMENT.match(line)):
            if line and not line.startswith(("|", "#", "<!--")) and CLAIM_WORDS.search(line):
                problems.append(f"line {index + 1}: a sentence in the claims' words with no claims spec: {line[:80]!r}")
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if not lines[i].strip()), len(lines))
        shown, checked = [x.strip() for x in lines[index + 1 : end]], checked + 1
        try:
            made = said_again(match.group(1), frames)
        except ValueError as exc:
            problems.append(f"line {index + 1} (observation): {exc}")
            made = shown
        problems += [
            f"line {n}: reads {a!r}, the results say {b!r}"
            for n, (a, b) in enumerate(zip(shown, made), index + 2)
            if a != b
        ]
        if len(shown) != len(made):
            problems.append(f"line {index + 1} (observation): {len(shown)} lines, the results say {len(made)}")
        index = end
    return checked, problems
