import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cs336_systems import loader_bench
from cs336_systems.models import ModelConfig, TransformerLM
from cs336_systems.probe import (
    LoaderInfo,
    ProbeRecord,
    Step,
    StepProbe,
    bound,
    compute_advice,
    input_advice,
    verdict,
)
from cs336_systems.results import read_results


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1e3


class SlowBatches:
    """An iterable whose every next() takes `wait_ms` of the fake clock."""

    def __init__(self, clock: FakeClock, n: int, wait_ms: float, batch=None):
        self.clock, self.n, self.wait_ms = clock, n, wait_ms
        self.batch = torch.zeros(4, 8) if batch is None else batch

    def __iter__(self):
        for _ in range(self.n):
            self.clock.advance(self.wait_ms)
            yield self.batch


def fake_probe(clock, **kwargs) -> StepProbe:
    kwargs.setdefault("print_fn", lambda line: None)
    return StepProbe(device="cpu", clock=clock, **kwargs)


def run_loop(probe, clock, steps, wait_ms, phases, other_ms=0.0):
    for _ in probe.loader(SlowBatches(clock, steps, wait_ms)):
        for name, ms in phases.items():
            with probe.phase(name):
                clock.advance(ms)
        clock.advance(other_ms)
        probe.step()


def test_wait_and_phases_with_a_fake_clock():
    clock = FakeClock()
    probe = fake_probe(clock, batch_size=4, window=10)
    run_loop(probe, clock, 10, wait_ms=30, phases={"forward": 10, "backward": 20, "optimizer": 5}, other_ms=35)
    probe.close()
    (record,) = probe.records
    assert record.steps == 10 and (record.first_step, record.last_step) == (1, 10)
    assert record.step_ms == pytest.approx(100.0)
    assert record.data_wait_ms == pytest.approx(30.0)
    assert record.data_wait_pct == pytest.approx(30.0)
    assert record.verdict == "input-bound"
    assert record.phases == "forward=10.000 backward=20.000 optimizer=5.000"
    assert record.phases_pct == pytest.approx(35.0)
    assert record.outside_pct == pytest.approx(35.0)
    assert record.samples_per_s == pytest.approx(40 / 1.0)
    assert record.step_wait_ms == pytest.approx([30.0] * 10)
    assert record.step_phase_ms[3] == pytest.approx({"forward": 10.0, "backward": 20.0, "optimizer": 5.0})


def test_a_phase_entered_twice_in_a_step_adds_up():
    clock = FakeClock()
    probe = fake_probe(clock, window=1)
    for _ in probe.loader(SlowBatches(clock, 1, 0)):
        for _ in range(3):  # gradient accumulation: three forwards
            with probe.phase("forward"):
                clock.advance(2)
        probe.step()
    assert probe.records[0].step_phase_ms == [{"forward": pytest.approx(6.0)}]


def test_summary_line():
    clock, lines = FakeClock(), []
    probe = fake_probe(clock, batch_size=4, window=2, print_fn=lines.append)
    run_loop(probe, clock, 2, wait_ms=30, phases={"to device": 10, "forward": 60})
    assert lines == [
        "probe train steps 1-2: step 100.0 ms, 40.0 samples/s, data wait 30.0% (input-bound), "
        "to device 10.0 ms, forward 60.0 ms"
    ]


def test_windows_are_written_as_they_close(tmp_path):
    clock = FakeClock()
    csv = tmp_path / "probe.csv"
    probe = fake_probe(clock, output=csv, window=3)
    run_loop(probe, clock, 3, wait_ms=1, phases={"forward": 1})
    assert len(read_results(csv)) == 1  # flushed at the window's end, before close
    run_loop(probe, clock, 4, wait_ms=1, phases={"forward": 1})
    probe.close()
    frame = read_results(csv)
    assert list(frame["first_step"]) == [1, 4, 7] and list(frame["last_step"]) == [3, 6, 7]
    assert list(frame["steps"]) == [3, 3, 1] and set(frame["status"]) == {"ok"}


def test_samples_are_counted_from_the_batches_when_no_batch_size_is_known():
    clock = FakeClock()
    probe = fake_probe(clock, window=2)
    run_loop(probe, clock, 2, wait_ms=0, phases={"forward": 50})
    assert probe.records[0].samples == 8  # the batches' first dimension
    assert probe.records[0].samples_per_s == pytest.approx(80.0)


def test_verdict_bands_are_loader_benchs():
    assert verdict is loader_bench.verdict
    for wait, expected in ((2, "not input-bound"), (10, "moderately input-bound"), (50, "input-bound")):
        clock = FakeClock()
        probe = fake_probe(clock, window=4)
        run_loop(probe, clock, 4, wait_ms=wait, phases={"step": 100 - wait})
        assert probe.records[0].verdict == expected
        assert probe.records[0].data_wait_pct == pytest.approx(wait)


def test_bound():
    assert bound(30.0, 60.0, on_gpu=True, device_busy_pct=None) == "input"
    assert bound(5.0, 90.0, on_gpu=False, device_busy_pct=None) == "input"  # moderately input-bound
    assert bound(1.0, 50.0, on_gpu=True, device_busy_pct=None) == "host"
    assert bound(1.0, 95.0, on_gpu=True, device_busy_pct=40.0) == "host"  # a measured busy % wins
    assert bound(1.0, 50.0, on_gpu=False, device_busy_pct=None) == "compute"
    assert bound(1.0, 95.0, on_gpu=True, device_busy_pct=None) == "compute"


def test_writers_round_trip(tmp_path):
    clock = FakeClock()
    paths = [tmp_path / "p.csv", tmp_path / "p.jsonl", tmp_path / "p.md"]
    probe = fake_probe(clock, outputs=paths, batch_size=4, window=2, label="mine")
    run_loop(probe, clock, 4, wait_ms=10, phases={"forward": 30}, other_ms=10)
    probe.close()
    csv = read_results(paths[0])
    assert list(csv.columns) == list(ProbeRecord.row_fields())
    assert list(csv["data_wait_pct"]) == pytest.approx([20.0, 20.0])
    lines = [json.loads(line) for line in paths[1].read_text().splitlines()]
    assert [row["step_wall_ms"] for row in lines] == [pytest.approx([50.0, 50.0])] * 2
    assert lines[1]["step_phase_ms"] == [{"forward": pytest.approx(30.0)}] * 2
    md = paths[2].read_text()
    assert list(read_results(paths[2])["run"]) == ["mine", "mine"]
    assert "Advice:" in md and "input-bound" in md and "device_name" in md


def test_an_exception_in_the_loop_still_writes_what_was_measured(tmp_path):
    clock = FakeClock()
    paths = [tmp_path / "p.csv", tmp_path / "p.md"]
    with pytest.raises(RuntimeError, match="boom"), fake_probe(clock, outputs=paths, window=10) as probe:
        for i, _ in enumerate(probe.loader(SlowBatches(clock, 100, 5))):
            with probe.phase("forward"):
                clock.advance(5)
                if i == 4:
                    raise RuntimeError("boom")
            probe.step()
    frame = read_results(paths[0])
    assert len(frame) == 1 and frame["status"][0] == "error" and "RuntimeError: boom" in frame["error"][0]
    assert frame["steps"][0] == 4  # the four complete steps; the fifth's time still counts
    assert frame["wall_s"][0] == pytest.approx(0.05)
    assert "boom" in paths[1].read_text()


def test_a_probe_never_closed_writes_at_exit(tmp_path):
    script = textwrap.dedent(f"""
        from cs336_systems.probe import StepProbe
        probe = StepProbe(outputs=[{str(tmp_path / "p.csv")!r}, {str(tmp_path / "p.md")!r}], window=100)
        for i, batch in enumerate(probe.loader(range(10))):
            with probe.phase("forward"):
                pass
            probe.step()
            if i == 2:
                raise SystemExit("the user's loop gave up")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    frame = read_results(tmp_path / "p.csv")
    assert frame["steps"][0] == 3 and frame["status"][0] == "ok"
    assert "Advice:" in (tmp_path / "p.md").read_text()


class FakeEvent:
    synchronized = False

    def __init__(self, clock: FakeClock):
        self.clock, self.time = clock, None

    def record(self):
        self.time = self.clock.now

    def elapsed_time(self, end):
        assert FakeEvent.synchronized, "an event was read before the window's synchronize"
        return 1e3 * (end.time - self.time) * 2  # the device takes twice the host's time


def test_cuda_event_path_synchronizes_once_per_window():
    clock, syncs = FakeClock(), []

    def synchronize():
        syncs.append(clock.now)
        FakeEvent.synchronized = True

    FakeEvent.synchronized = False
    probe = fake_probe(
        clock, timer="cuda-events", window=4, event_factory=lambda: FakeEvent(clock), synchronize=synchronize
    )
    for i, _ in enumerate(probe.loader(SlowBatches(clock, 8, 1))):
        for name in ("forward", "backward", "optimizer"):
            with probe.phase(name):
                clock.advance(3)
        probe.step()
        assert len(syncs) == (i + 1) // 4  # none inside a window's steps
        FakeEvent.synchronized = False
    probe.close()
    assert len(syncs) == 2
    assert probe.timer == "cuda-events" and probe.records[0].phases == "forward=6.000 backward=6.000 optimizer=6.000"
    assert probe.records[0].outside_pct is None  # device time overlaps the host's: no sum


def test_refusals():
    with pytest.raises(ValueError, match="window"):
        StepProbe(window=0)
    with pytest.raises(ValueError, match="timer"):
        StepProbe(timer="wallclock")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        StepProbe(timer="cuda-events")
    with pytest.raises(ValueError, match="suffix"):
        StepProbe(output="probe.txt")


def test_input_advice_predicts_workers_and_their_buffer():
    steps = [Step(wall_ms=50.0, wait_ms=40.0, phase_ms={}, samples=4)] * 10
    info = LoaderInfo(
        num_workers=0, prefetch_factor=None, pin_memory=False, persistent_workers=False, batch_size=4, num_items=400
    )
    text = "\n".join(input_advice(steps, info, batch_bytes=4 * 2**20, pinned=False))
    assert "try num_workers=5 (prefetch_factor=2): loader_bench's closed form needs 4" in text
    # closed form with 5 workers: 40 + 9 * max(10, 40/5) + 10 = 140 ms over 10 steps
    assert "predicts a 14.0 ms step (3.6x)" in text
    buffer = loader_bench.predicted_buffer_bytes(5, 2, 4 * 2**20, False)
    assert f"up to {buffer / 2**20:.2f} MiB" in text
    assert "local copy" in text and "400.00 MiB" in text
    # with 2 workers and still waiting: a batch takes 2 steps to fetch, so 100 ms / 10 ms -> 10 workers
    info2 = LoaderInfo(2, 2, False, False, 4, 400)
    text2 = "\n".join(input_advice(steps, info2, 4 * 2**20, False))
    assert "needs 10 to keep up" in text2 and "persistent_workers=True" in text2


def test_compute_advice_asks_the_estimator_about_a_larger_batch():
    model = TransformerLM(ModelConfig(d_model=32, d_ff=64, num_layers=1, num_heads=2, vocab_size=64, context_length=16))
    text = "\n".join(compute_advice(model, 8, 16, "fp32", torch.device("cpu")))
    assert "batch size 16 (from 8): the estimator predicts" in text and "fits" in text
    assert "the estimator" not in "\n".join(compute_advice(torch.nn.Linear(2, 2), 8, 16, "fp32", torch.device("cpu")))


def test_end_to_end_on_a_tiny_cpu_loop(tmp_path):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lines = []
    with StepProbe(outputs=[tmp_path / "p.csv", tmp_path / "p.jsonl"], window=4, print_fn=lines.append) as probe:
        for _epoch in range(2):
            for x, y in probe.loader(loader):
                with probe.phase("forward"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with probe.phase("backward"):
                    loss.backward()
                with probe.phase("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad()
                probe.step()
    frame = read_results(tmp_path / "p.csv")
    assert len(frame) == 4 and frame["steps"].sum() == 16 and frame["samples"].sum() == 128
    assert probe.batch_size == 8 and probe.loader_info.num_workers == 0
    assert all(set(step) == {"forward", "backward", "optimizer"} for step in probe.records[0].step_phase_ms)
    assert len([line for line in lines if line.startswith("probe train steps")]) == 4
    assert lines[-1].startswith("probe advice:")


def test_summary_goes_through_tqdm_when_a_bar_is_active(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    written = []
    monkeypatch.setattr(tqdm.tqdm, "write", classmethod(lambda cls, line, file=None: written.append(line)))
    clock = FakeClock()
    probe = StepProbe(device="cpu", clock=clock, window=2)
    with tqdm.tqdm(total=2, disable=False) as bar:
        run_loop(probe, clock, 2, wait_ms=1, phases={"forward": 1})
        bar.update(2)
    assert len(written) == 1 and written[0].startswith("probe train steps 1-2")


def test_a_probed_loop_costs_microseconds_per_step():
    """What the probe adds to a step, in this thread's CPU time: other processes on a busy machine
    stretch a wall clock, not the CPU time the probe itself spends."""

    def loop(probe, steps=400) -> float:
        start = time.thread_time()
        for _ in probe.loader(range(steps)) if probe else range(steps):
            if probe:
                with probe.phase("forward"):
                    pass
                with probe.phase("backward"):
                    pass
                probe.step()
        return (time.thread_time() - start) / steps

    probe = StepProbe(window=10, print_fn=lambda line: None)
    per_step_s = min(loop(probe) for _ in range(3)) - min(loop(None) for _ in range(3))
    probe.close()
    assert per_step_s < 1e-3  # a step of a real loop is milliseconds at least: the probe's share stays small


def run_script(*args, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


def test_train_with_probe_writes_its_outputs(tmp_path):
    prefix = tmp_path / "story"
    done = run_script(
        "scripts/train_with_probe.py",
        "--num-workers",
        "0",
        "--steps",
        "3",
        "--window",
        "2",
        "--batch-size",
        "2",
        "--context-length",
        "8",
        "--latency-ms",
        "0",
        "--output-prefix",
        str(prefix),
    )
    assert done.returncode == 0, done.stderr
    assert list(read_results(prefix.with_suffix(".csv"))["steps"]) == [2, 1]
    assert len(prefix.with_suffix(".jsonl").read_text().splitlines()) == 2
    assert "## num_workers=0" in prefix.with_suffix(".md").read_text()
    refused = run_script("scripts/train_with_probe.py", "--output-prefix", str(tmp_path / "story.csv"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "suffix" in refused.stderr


def test_bench_probe_overhead_writes_its_outputs(tmp_path):
    csv, md = tmp_path / "o.csv", tmp_path / "o.md"
    done = run_script(
        "scripts/checks/bench_probe_overhead.py",
        "--steps",
        "200",
        "--repeats",
        "1",
        "--output",
        str(csv),
        "--output",
        str(md),
    )
    assert done.returncode in (0, 1), done.stderr  # 1: over the target on a loaded machine
    frame = read_results(csv)
    assert len(frame) == 4
    assert list(read_results(md)["overhead_ms_per_step"]) == pytest.approx(
        list(frame["overhead_ms_per_step"]), abs=5e-4
    )
    assert (frame["passed"] == (frame["overhead_ms_per_step"] < 0.1)).all()
    assert run_script("scripts/checks/bench_probe_overhead.py", "--steps", "0").returncode == 2
    refused = run_script("scripts/checks/bench_probe_overhead.py", "--output", str(tmp_path / "o.txt"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "suffix" in refused.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_cuda_loop_times_phases_with_events():
    model = torch.nn.Linear(256, 256).cuda()
    probe = StepProbe(device="cuda", window=5, print_fn=lambda line: None)
    for x in probe.loader([torch.randn(32, 256) for _ in range(10)]):
        with probe.phase("forward"):
            y = model(x.cuda(non_blocking=True))
        with probe.phase("backward"):
            y.sum().backward()
        probe.step()
    probe.close()
    assert probe.timer == "cuda-events" and len(probe.records) == 2
    assert all(set(step) == {"forward", "backward"} for r in probe.records for step in r.step_phase_ms)
    assert all(ms > 0 for r in probe.records for step in r.step_phase_ms for ms in step.values())


def test_two_ranks_on_one_output_both_write_or_the_second_says_why_in_one_line(tmp_path, monkeypatch):
    import fcntl
    import os

    from cs336_systems.probe.core import _rank_path
    from cs336_systems.results.paths import lock_path

    path = tmp_path / "probe.csv"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")  # torchrun's, before init_process_group
    assert _rank_path(path) == tmp_path / "probe.rank1.csv"
    monkeypatch.delenv("RANK")
    held = os.open(lock_path(path), os.O_RDWR | os.O_CREAT)  # another process writes it (not a rank we can tell)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        said: list[str] = []
        clock = FakeClock()
        probe = fake_probe(clock, output=path, window=2, print_fn=said.append)
        run_loop(probe, clock, steps=4, wait_ms=1.0, phases={"forward": 5.0})
        probe.close()
    finally:
        os.close(held)
    assert said[0].startswith("probe: error: ") and "is being written by process" in said[0]
    assert "give each process its own output" in said[0] and len(probe.records) == 2  # measured all the same
    assert not path.exists()
