"""Progress on stderr: tqdm's bar on a terminal, whole lines in a log file."""

import io
import sys
import time

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


def test_a_sweeps_parent_relays_only_its_childs_still_measuring_lines(tmp_path, capsys):
    """The child measuring one configuration writes its stderr to a file; while the parent waits, the lines
    that say a slow configuration lives reach the user, the rest (size table, notes) stays in the file."""
    import subprocess

    from cs336_systems.child import _wait_relaying

    script = (
        "import sys, time\n"
        "print('size table 2026', file=sys.stderr, flush=True)\n"
        "print('xl fp32 T=512: still measuring: warmup step 1 of 2 took 61.0 s', file=sys.stderr, flush=True)\n"
        "time.sleep(1.5)\n"
        "print('xl fp32 T=512: still measuring: measured step 1 of 5 took 60.5 s', file=sys.stderr, flush=True)\n"
        "time.sleep(1.5)\n"
    )
    path = tmp_path / "stderr.txt"
    with open(path, "w+") as stderr_file:
        process = subprocess.Popen([sys.executable, "-c", script], stderr=stderr_file)
        _wait_relaying(process, 30.0, progress.HeartbeatRelay(path))
    assert capsys.readouterr().err.splitlines() == [
        "xl fp32 T=512: still measuring: warmup step 1 of 2 took 61.0 s",
        "xl fp32 T=512: still measuring: measured step 1 of 5 took 60.5 s",
    ]
    assert path.read_text().startswith(
        "size table 2026\n"
    )  # the child's file is whole: our reads moved no offset of its


def test_the_parent_tells_the_child_how_often_to_say_it_lives(monkeypatch, capsys):
    monkeypatch.setenv(progress.HEARTBEAT_ENV, "10")
    assert progress.heartbeat_interval() == 10.0
    for bad in ("", "soon", "nan", "-1"):
        monkeypatch.setenv(progress.HEARTBEAT_ENV, bad)
        assert progress.heartbeat_interval() == progress.LOG_EVERY_S / 2  # capsys: stderr is not a terminal


def test_a_phase_is_said_as_it_starts_and_a_long_one_lives_in_a_line_from_the_heartbeats_thread(monkeypatch):
    """benchmark says each phase (building, warmup, the profiled step, the peak probe) as it starts; a phase
    longer than the interval (a build, one step, a probe) gets a line from the heartbeat's own thread, so a
    log never waits longer than the interval. The thread reads the clock; here the clock is the test's."""
    log, clock = io.StringIO(), Clock()
    monkeypatch.setattr(sys, "stderr", log)
    beat = progress.StepHeartbeat("small fp32", every_s=30.0, clock=clock.monotonic, announce=True)
    beat.phase("building the model")
    with beat.running():
        clock.now += 31  # the build is slow: the thread, which looks each second, says it lives
        deadline = time.monotonic() + 60
        while "still measuring" not in log.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        beat.phase("the measured steps")
    assert log.getvalue().splitlines() == [
        "small fp32: building the model",
        "small fp32: still measuring: building the model (31 s since this configuration started)",
        "small fp32: the measured steps",
    ]
    quiet = progress.StepHeartbeat("small fp32", every_s=30.0, clock=clock.monotonic)
    quiet.phase("building the model")  # a sweep's configuration says nothing until it is slow
    assert len(log.getvalue().splitlines()) == 3


def test_a_postfix_holds_no_second_bar_and_is_cut_between_words():
    line = "memory_profiling-a: custom sdpa fp32 T=8 forward:  25%|##5       | 1/4 [00:03<00:11,  3.80s/config]"
    assert progress.postfix(line) == "memory_profiling-a: custom sdpa fp32 T=8 forward 1/4"
    cut = progress.postfix("step: " + "measuring " * 20, width=40)
    assert len(cut) <= 40 and cut.endswith("measuring ...")
