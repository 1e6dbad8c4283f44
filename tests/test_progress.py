"""Progress on stderr: tqdm's bar on a terminal, whole lines in a log file."""

import io
import sys

from tqdm import tqdm

from cs336_systems import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def test_a_terminal_gets_tqdms_bar(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress.progress_bar(2, "step")
    assert type(bar) is tqdm
    bar.close()


def test_a_log_gets_one_whole_line_per_finished_unit_and_a_heartbeat_a_minute(monkeypatch):
    log, clock = io.StringIO(), Clock()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress.time, "monotonic", clock.monotonic)
    bar = progress.progress_bar(2, "step", "handout")
    for second in range(59):  # a step's own progress, every second: within a minute, no line
        clock.now += 1
        bar.set_postfix_str(f"step 1: line {second}")
    clock.now += 2  # a minute since the last line: one line says the step lives
    bar.set_postfix_str("step 1: still going")
    bar.write("step 1: error (log: x.log)", file=sys.stderr)
    bar.update(1)
    bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert [line.split("|")[0].strip() for line in lines] == [
        "handout:   0%",
        "handout:   0%",
        "step 1: error (log: x.log)",
        "handout:  50%",
        "handout: 100%",
    ]
    assert lines[1].endswith("step 1: still going]")
