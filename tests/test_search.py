"""The doubling-then-bisection search against hand-made predicates (no processes)."""

from cs336_systems.search import search_boundary as search


def test_search_logic_without_processes():
    statuses = []

    def probe(value):
        statuses.append(value)
        return "ok" if value <= 37 else "oom"

    result = search(probe, start=1, maximum=1000, resolution=1, dimension="batch-size")
    assert (result.largest_ok, result.smallest_oom, result.complete) == (37, 38, True)
    assert statuses[:7] == [1, 2, 4, 8, 16, 32, 64]

    # a start that does not fit: halve down to a fit, then bisect up
    down = search(lambda v: "ok" if v <= 37 else "oom", 500, 1000, 1, "batch-size")
    assert [v for v, _ in down.probes[:5]] == [500, 250, 125, 62, 31]
    assert (down.largest_ok, down.smallest_oom, down.complete) == (37, 38, True)

    nothing = search(lambda v: "oom", 4, 100, 1, "b")
    assert nothing.probes == [(4, "oom"), (2, "oom"), (1, "oom")] and not nothing.complete
    assert nothing.stopped_because == "even b 1 runs out of memory" and nothing.largest_ok is None

    capped = search(lambda v: "ok", 1, 12, 1, "b")
    assert [v for v, _ in capped.probes] == [1, 2, 4, 8, 12] and capped.complete
    assert "reached --max 12" in capped.stopped_because and capped.smallest_oom is None

    coarse = search(lambda v: "ok" if v <= 300 else "oom", 128, 4096, 64, "context-length")
    assert coarse.smallest_oom - coarse.largest_ok <= 64 and coarse.largest_ok <= 300 < coarse.smallest_oom

    failed = search(lambda v: "ok" if v < 4 else "timeout", 1, 8, 1, "b")
    assert "'timeout'" in failed.stopped_because and failed.largest_ok == 2 and not failed.complete
