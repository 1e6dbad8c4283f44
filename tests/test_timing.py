import pytest
import torch

from cs336_systems import benchmark
from cs336_systems.stats import summarize
from cs336_systems.timing import (
    CudaEventTimer,
    DoBenchTimer,
    HostTimer,
    device_synchronizer,
    make_timer,
    time_steps,
    timer_unsupported_reason,
)
from tests.helpers import run_main
from tests.tiny import TINY


class FakeClock:
    """Advances only when the fake step runs, by a scripted duration."""

    def __init__(self):
        self.now = 0.0
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.now


def test_loop_excludes_warmup_and_times_each_step():
    clock = FakeClock()
    durations = iter([0.5, 0.4, 0.010, 0.020, 0.030])  # two warmup steps, three measured (seconds)
    events = []

    def step():
        events.append("step")
        clock.now += next(durations)

    def synchronize():
        events.append("sync")

    times = time_steps(step, warmup_steps=2, measure_steps=3, timer=HostTimer(clock, synchronize))
    assert times.warmup_ms == pytest.approx((500.0, 400.0))
    assert times.measured_ms == pytest.approx((10.0, 20.0, 30.0))
    # synchronize before starting the clock and before reading it, around every step
    assert events == ["sync", "step", "sync"] * 5
    assert clock.reads == 10


def test_synchronize_is_inside_the_clock_window():
    """Work still queued on the device at the end of a step must be counted."""
    clock = FakeClock()

    def step():
        clock.now += 0.001  # host-side launch only

    def synchronize():
        clock.now += 0.002  # device drains its queue: happens after the clock started

    times = time_steps(step, warmup_steps=0, measure_steps=1, timer=HostTimer(clock, synchronize))
    # first sync (before start) is excluded; the one before reading is included
    assert times.measured_ms == pytest.approx((3.0,))


def test_fake_cuda_device_synchronizes(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    sync = device_synchronizer(torch.device("cuda", 0))
    timer = HostTimer(FakeClock(), sync)
    time_steps(lambda: None, warmup_steps=1, measure_steps=4, timer=timer)
    assert len(calls) == 2 * 5
    assert device_synchronizer(torch.device("cpu"))() is None


class FakeEvent:
    log = []

    def __init__(self):
        self.time = None

    def record(self):
        FakeEvent.log.append("record")
        self.time = FakeEvent.now

    def synchronize(self):
        FakeEvent.log.append("wait")

    def elapsed_time(self, end):
        return end.time - self.time


def test_cuda_event_timer_records_a_pair_per_step():
    FakeEvent.log, FakeEvent.now = [], 0.0
    durations = iter([5.0, 7.0, 9.0])

    def step():
        FakeEvent.now += next(durations)

    times = time_steps(step, warmup_steps=1, measure_steps=2, timer=CudaEventTimer(FakeEvent))
    assert times.measured_ms == (7.0, 9.0)
    assert FakeEvent.log == ["record", "record", "wait"] * 3


def test_bad_step_counts_rejected():
    with pytest.raises(ValueError):
        time_steps(lambda: None, warmup_steps=0, measure_steps=0, timer=HostTimer())
    with pytest.raises(ValueError):
        time_steps(lambda: None, warmup_steps=-1, measure_steps=1, timer=HostTimer())


def test_cuda_event_timer_refused_on_cpu():
    with pytest.raises(ValueError, match="CUDA"):
        make_timer("cuda-event", torch.device("cpu"))


def test_do_bench_timer_takes_one_sample_per_do_bench_call():
    calls = []

    def fake_do_bench(step):  # as Triton's: runs the step as often as it likes, returns the mean ms
        for _ in range(4):
            step()
        calls.append("do_bench")
        return 2.5 * len(calls)

    steps = []
    times = time_steps(lambda: steps.append(1), warmup_steps=1, measure_steps=2, timer=DoBenchTimer(fake_do_bench))
    assert times.warmup_ms == (2.5,) and times.measured_ms == (5.0, 7.5)
    assert len(calls) == 3 and len(steps) == 12
    timer = make_timer("do-bench", torch.device("cuda"), do_bench=fake_do_bench)
    assert isinstance(timer, DoBenchTimer) and timer.do_bench is fake_do_bench


def test_do_bench_is_refused_on_a_cpu_and_without_triton(monkeypatch, capsys):
    import sys

    assert "needs a CUDA device" in timer_unsupported_reason("do-bench", torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    assert "needs Triton" in timer_unsupported_reason("do-bench", torch.device("cuda"))
    assert timer_unsupported_reason("do-bench", torch.device("cuda"), do_bench=lambda step: 1.0) is None
    code, out, err = run_main(benchmark.main, capsys, *TINY, "--timer", "do-bench")
    assert code == 2 and out == "" and err.count("\n") == 1 and "--timer do-bench needs a CUDA device" in err


def test_budget_stops_slow_warmup_and_measurement_after_enough_steps():
    clock = FakeClock()

    def step():
        clock.now += 2.0  # every step takes 2 s

    times = time_steps(step, warmup_steps=5, measure_steps=100, timer=HostTimer(clock), budget_s=3.0)
    assert len(times.warmup_ms) == 2  # 4 s >= 3 s after the second warmup step
    assert len(times.measured_ms) == 3  # the budget is spent after 2 steps, but 3 are the minimum
    fast = time_steps(lambda: None, warmup_steps=2, measure_steps=50, timer=HostTimer(clock), budget_s=3.0)
    assert len(fast.measured_ms) == 50  # a budget never cuts steps that fit in it
    few = time_steps(step, warmup_steps=0, measure_steps=2, timer=HostTimer(clock), budget_s=0.5)
    assert len(few.measured_ms) == 2  # never more than asked


def test_untimed_setup_runs_before_each_step_outside_the_clock():
    from cs336_systems.timing import UntimedSetup

    clock, events = FakeClock(), []

    def setup():
        events.append("setup")
        clock.now += 100.0  # slow, and not counted

    def step():
        events.append("step")
        clock.now += 0.25

    times = time_steps(step, warmup_steps=1, measure_steps=2, timer=UntimedSetup(HostTimer(clock), setup))
    assert events == ["setup", "step"] * 3
    assert times.measured_ms == pytest.approx((250.0, 250.0))


def _phased_step(clock, phases, durations: dict[str, float], between: float = 0.0):
    """A step whose phases advance the fake clock by `durations` (seconds), `between` outside them."""

    def step():
        clock.now += between
        for name, seconds in durations.items():
            with phases.phase(name):
                clock.now += seconds

    return step


def test_host_phases_add_up_to_the_step_with_no_extra_sync():
    from cs336_systems.timing import HostPhases

    clock, syncs = FakeClock(), []
    phases = HostPhases(clock)
    step = _phased_step(clock, phases, {"forward": 0.010, "backward": 0.020, "optimizer": 0.005})
    times = time_steps(
        step, warmup_steps=2, measure_steps=3, timer=HostTimer(clock, lambda: syncs.append(1)), phases=phases
    )
    assert list(times.phase_ms) == ["forward", "backward", "optimizer"]
    assert times.phase_ms["forward"] == pytest.approx((10.0,) * 3)
    assert times.phase_ms["backward"] == pytest.approx((20.0,) * 3)
    assert times.phase_ms["optimizer"] == pytest.approx((5.0,) * 3)
    for index, step_ms in enumerate(times.measured_ms):
        assert sum(samples[index] for samples in times.phase_ms.values()) == pytest.approx(step_ms)
    assert len(syncs) == 2 * 5  # the step timer's two per step, warmup included; the phases add none
    assert clock.reads == 2 * 5 + 2 * 3 * 3  # two reads per phase, measured steps only


def test_host_phases_leave_out_time_between_phases_and_warmup():
    from cs336_systems.timing import HostPhases

    clock = FakeClock()
    phases = HostPhases(clock)
    step = _phased_step(clock, phases, {"forward": 0.010}, between=0.002)
    times = time_steps(step, warmup_steps=1, measure_steps=2, timer=HostTimer(clock), phases=phases)
    assert times.measured_ms == pytest.approx((12.0, 12.0))
    assert times.phase_ms == {"forward": pytest.approx((10.0, 10.0))}
    assert phases.phase("forward") is phases.phase("backward")  # outside a measured step: a shared no-op


def test_cuda_event_phases_record_only_and_resolve_once_after_the_steps():
    """On a (fake) CUDA device: no synchronize per phase; one wait on the last event, after measuring."""
    from cs336_systems.timing import CudaEventPhases

    FakeEvent.log, FakeEvent.now = [], 0.0
    syncs = []
    phases = CudaEventPhases(FakeEvent)

    def step():
        for name, ms in (("forward", 3.0), ("backward", 6.0), ("optimizer", 1.0)):
            with phases.phase(name):
                FakeEvent.now += ms

    def synchronize():
        syncs.append(len(FakeEvent.log))

    times = time_steps(step, warmup_steps=1, measure_steps=2, timer=HostTimer(FakeClock(), synchronize), phases=phases)
    assert times.phase_ms == {"forward": (3.0, 3.0), "backward": (6.0, 6.0), "optimizer": (1.0, 1.0)}
    assert len(syncs) == 2 * 3  # the host timer's own, nothing added
    assert FakeEvent.log == ["record"] * 12 + ["wait"]  # 3 pairs per measured step, then one wait


def test_cuda_event_phases_inside_a_cuda_event_step_timer():
    from cs336_systems.timing import CudaEventPhases

    FakeEvent.log, FakeEvent.now = [], 0.0
    phases = CudaEventPhases(FakeEvent)

    def step():
        FakeEvent.now += 0.5  # outside any phase
        with phases.phase("forward"):
            FakeEvent.now += 4.0

    times = time_steps(step, warmup_steps=0, measure_steps=2, timer=CudaEventTimer(FakeEvent), phases=phases)
    assert times.measured_ms == (4.5, 4.5) and times.phase_ms == {"forward": (4.0, 4.0)}
    assert FakeEvent.log == ["record"] * 4 + ["wait"] + ["record"] * 4 + ["wait"] + ["wait"]


def test_phases_of_a_real_cpu_train_step_add_up_to_the_step():
    from cs336_systems.factory import build_model
    from cs336_systems.optimizer import make_optimizer
    from cs336_systems.step import make_step
    from cs336_systems.timing import HostPhases
    from tests.helpers import tiny_benchmark_config, tiny_model_config

    config = tiny_benchmark_config(
        pass_type="train-step", context_length=64, batch_size=4, model=tiny_model_config(context_length=64)
    )
    device = torch.device("cpu")
    model = build_model(config.model, device)
    phases = HostPhases()
    step = make_step(config, model, device, make_optimizer(model, device), phase=phases.phase)
    times = time_steps(step, warmup_steps=2, measure_steps=5, timer=HostTimer(), phases=phases)
    assert list(times.phase_ms) == ["forward", "backward", "optimizer"]
    phase_total = sum(sum(samples) for samples in times.phase_ms.values())
    assert phase_total <= sum(times.measured_ms)
    assert phase_total == pytest.approx(sum(times.measured_ms), rel=0.05)


def test_measuring_until_resolved_stops_at_the_target_or_the_cap():
    clock = FakeClock()
    # five noisy steps, then steady ones: IQR/median falls under 5% once enough steady steps are in
    durations = iter([0.010, 0.030, 0.012, 0.025, 0.015] + [0.010] * 100)

    def step():
        clock.now += next(durations)

    times = time_steps(step, warmup_steps=0, measure_steps=5, timer=HostTimer(clock), target_iqr_pct=5.0)
    assert times.target_reached and 5 < len(times.measured_ms) < 105
    assert summarize(times.measured_ms).iqr_pct <= 5.0
    # a step that never settles: stopped by the time cap, and said so
    noisy = iter([0.010, 0.030] * 1000)
    alternating = time_steps(
        lambda: setattr(clock, "now", clock.now + next(noisy)),
        warmup_steps=0,
        measure_steps=5,
        timer=HostTimer(clock),
        target_iqr_pct=5.0,
        max_measure_s=1.0,
    )
    assert alternating.target_reached is False and 1000 <= sum(alternating.measured_ms) < 1100
    plain = time_steps(lambda: None, warmup_steps=0, measure_steps=4, timer=HostTimer(clock))
    assert plain.target_reached is None and len(plain.measured_ms) == 4  # no target: exactly as asked


def test_after_step_hears_each_step_outside_its_timing_and_a_slow_one_prints_a_line(capsys):
    from cs336_systems.progress import StepHeartbeat

    clock = FakeClock()
    durations = iter([12.0, 3.0, 2.0, 2.0, 9.0])  # seconds: a slow configuration, two warmup steps, three measured
    heard = []

    def step():
        clock.now += next(durations)

    beat = StepHeartbeat("xl fp32", every_s=10.0, clock=lambda: clock.now)

    def after(kind, index, planned, ms):
        heard.append((kind, index, planned, ms, clock.reads))
        beat(kind, index, planned, ms)

    times = time_steps(step, warmup_steps=2, measure_steps=3, timer=HostTimer(clock), after_step=after)
    assert [h[:4] for h in heard] == [
        ("warmup", 1, 2, 12000.0),
        ("warmup", 2, 2, 3000.0),
        ("measured", 1, 3, 2000.0),
        ("measured", 2, 3, 2000.0),
        ("measured", 3, 3, 9000.0),
    ]
    assert [h[4] for h in heard] == [2, 4, 6, 8, 10]  # after the step's second clock read: outside its timing
    assert times.measured_ms == pytest.approx((2000.0, 2000.0, 9000.0))
    # a line only when 10 s passed since the last one: after the first step (12 s) and the last (13 s later)
    assert capsys.readouterr().err.splitlines() == [
        "xl fp32: still measuring: warmup step 1 of 2 took 12.0 s (12 s since this configuration started)",
        "xl fp32: still measuring: measured step 3 of 3 took 9.0 s (28 s since this configuration started)",
    ]
