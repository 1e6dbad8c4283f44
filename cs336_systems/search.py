"""The largest value that still runs: doubling, then bisection.

Used by find_max (each probe a real run in a child process) and by the memory
estimator's --find-max (each probe a prediction). The probe returns a status: 'ok'
and 'oom' steer the search; any other status stops it with that status recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Search:
    dimension: str
    largest_ok: int | None = None
    smallest_oom: int | None = None
    complete: bool = False  # the answer stands: boundary found or the maximum reached
    stopped_because: str = ""
    probes: list[tuple[int, str]] = field(default_factory=list)


def search_boundary(
    probe: Callable[[int], str], start: int, maximum: int, resolution: int = 1, dimension: str = "value"
) -> Search:
    """Doubling from `start` while it runs (up to `maximum`), or halving while it runs out
    of memory (down to 1); then bisection between the largest 'ok' and the smallest 'oom'
    until they are `resolution` apart."""
    result = Search(dimension)

    def run(value: int) -> str:
        status = probe(value)
        result.probes.append((value, status))
        if status == "ok":
            result.largest_ok = value
        elif status == "oom":
            result.smallest_oom = value
        return status

    value = start
    status = run(value)
    while status == "ok" and value < maximum:  # up until it no longer fits
        value = min(2 * value, maximum)
        status = run(value)
    if status == "ok":
        result.complete = True
        result.stopped_because = f"reached --max {maximum} without running out of memory"
        return result
    while status == "oom" and result.largest_ok is None and value > 1:  # down until it fits
        value //= 2
        status = run(value)
    if status not in ("ok", "oom"):
        result.stopped_because = f"probe {value} ended with status {status!r}, not 'ok' or 'oom': search stopped"
        return result
    if result.largest_ok is None:
        result.stopped_because = f"even {dimension} 1 runs out of memory"
        return result
    while result.smallest_oom - result.largest_ok > resolution:
        value = (result.largest_ok + result.smallest_oom) // 2
        status = run(value)
        if status not in ("ok", "oom"):
            result.stopped_because = f"probe {value} ended with status {status!r}: search stopped"
            return result
    result.complete = True
    result.stopped_because = f"boundary found to within --resolution {resolution}"
    return result
