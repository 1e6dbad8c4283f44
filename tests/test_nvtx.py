"""NVTX ranges: pushed and popped in order when enabled (CUDA faked), nothing when disabled;
the disabled path is cheap and invisible to torch.compile; the nsys script's command line."""

import os
import stat
import subprocess
import time

import pytest
import torch

from cs336_systems import nvtx, runner
from cs336_systems.device import compile_unsupported_reason
from cs336_systems.factory import build_model
from cs336_systems.optimizer import make_optimizer
from cs336_systems.profiling import PROFILED_STEPS
from cs336_systems.step import make_step
from cs336_systems.timing import HostTimer, time_steps
from tests.helpers import REPO, tiny_benchmark_config

SCRIPT = REPO / "scripts" / "nsys_profile.sh"


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA 'available', with the NVTX and profiler calls recorded instead of made."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("profiler start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("profiler stop"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: calls.append("synchronize"))
    yield calls
    nvtx.disable()


def test_disabled_ranges_do_nothing(fake_cuda):
    nvtx.disable()
    with nvtx.range("a"), nvtx.capture():
        pass
    assert nvtx.range("a") is nvtx.range("b")  # one shared no-op, nothing allocated per call
    assert fake_cuda == []


def test_enable_without_cuda_stays_off(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvtx.enable() is False and not nvtx.is_enabled()


def test_enabled_ranges_push_and_pop_in_order(fake_cuda):
    assert nvtx.enable() is True

    @nvtx.annotate("decorated")
    def work():
        with nvtx.range("inner"):
            return 7

    with nvtx.range("outer"):
        assert work() == 7
    with pytest.raises(ValueError), nvtx.range("failing"):
        raise ValueError("the range is still popped")
    assert fake_cuda == ["push outer", "push decorated", "push inner", "pop", "pop", "pop", "push failing", "pop"]


def test_time_steps_marks_warmup_steps_and_the_capture_region(fake_cuda):
    nvtx.enable()
    time_steps(lambda: fake_cuda.append("work"), warmup_steps=1, measure_steps=2, timer=HostTimer())
    assert fake_cuda == [
        "push warmup",
        "work",
        "pop",
        "profiler start",
        "push measured",
        "push step",
        "work",
        "pop",
        "push step",
        "work",
        "pop",
        "pop",
        "synchronize",
        "profiler stop",
    ]


def test_phase_callback_wraps_forward_backward_optimizer(fake_cuda):
    """How benchmark wires --nvtx: step.make_step(..., phase=nvtx.range)."""
    nvtx.enable()
    config = tiny_benchmark_config(pass_type="train-step")
    model = build_model(config.model, "cpu")
    step = make_step(config, model, torch.device("cpu"), make_optimizer(model, torch.device("cpu")), phase=nvtx.range)
    step()
    assert fake_cuda == ["push forward", "pop", "push backward", "pop", "push optimizer", "pop"]


@pytest.fixture
def recorded_ranges(monkeypatch):
    """Ranges 'enabled' on this CPU-only machine, the NVTX and profiler calls recorded."""
    calls = []
    monkeypatch.setattr(nvtx, "_enabled", True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(name))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: None)
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    return calls


def test_benchmark_run_marks_steps_phases_and_naive_attention(recorded_ranges):
    """What `benchmark --nvtx` shows in nsys: every range the issue names, balanced."""
    config = tiny_benchmark_config(pass_type="train-step", attention="naive", warmup_steps=1, measure_steps=2)
    record = runner.run_benchmark(config)
    assert record.status == "ok", record.error
    assert "NVTX ranges on" in record.notes
    pushes = [name for name in recorded_ranges if name != "pop"]
    assert len(pushes) == recorded_ranges.count("pop")
    assert pushes[0] == "warmup" and pushes.count("measured") == 1 and pushes.count("step") == 2
    layers = config.model.num_layers
    # warmup, measured, the untimed step that traces memory, the profiled steps
    steps = 1 + 2 + 1 + PROFILED_STEPS
    for name in ("forward", "backward", "optimizer"):
        assert pushes.count(name) == steps
    for name in ("attention/scores", "attention/softmax", "attention/weighted_sum"):
        assert pushes.count(name) == steps * layers
    measured = recorded_ranges[recorded_ranges.index("measured") :]
    assert measured[1:4] == ["step", "forward", "attention/scores"]


def test_sdpa_attention_has_no_inner_ranges(recorded_ranges):
    record = runner.run_benchmark(tiny_benchmark_config(pass_type="forward", attention="sdpa"))
    assert record.status == "ok" and "forward" in recorded_ranges
    assert not [name for name in recorded_ranges if name.startswith("attention/")]


def test_enabled_ranges_stay_out_of_a_compiled_graph(recorded_ranges):
    """Compiled code gets no ranges (they would break its graph); the eager code around it does."""
    if compile_unsupported_reason(torch.device("cpu")):
        pytest.skip("torch.compile unavailable here")
    from cs336_systems.layers import naive_causal_attention

    torch._dynamo.reset()
    q, k, v = torch.randn(3, 1, 2, 8, 4).unbind(0)
    compiled = torch.compile(naive_causal_attention, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v), naive_causal_attention(q, k, v))
    assert recorded_ranges.count("attention/softmax") == 1  # the eager call only


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the ranges are emitted")
def test_benchmark_cli_nvtx_without_cuda_is_a_note(capsys):
    from cs336_systems import benchmark

    tiny = [
        "--d-model",
        "32",
        "--d-ff",
        "64",
        "--num-layers",
        "1",
        "--num-heads",
        "2",
        "--vocab-size",
        "50",
        "--context-length",
        "8",
        "--batch-size",
        "1",
        "--warmup-steps",
        "0",
        "--measure-steps",
        "1",
        "--device",
        "cpu",
        "--pass-type",
        "forward",
    ]
    try:
        assert benchmark.main(["--nvtx", *tiny]) == 0
    finally:
        nvtx.disable()
    assert "--nvtx does nothing on cpu" in capsys.readouterr().err


def test_disabled_range_costs_well_under_a_microsecond():
    nvtx.disable()
    calls = 200_000

    def per_call_ns(body) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter_ns()
            body()
            best = min(best, (time.perf_counter_ns() - start) / calls)
        return best

    def with_ranges():
        for _ in range(calls):
            with nvtx.range("attention/softmax"):
                pass

    def bare_loop():
        for _ in range(calls):
            pass

    cost = per_call_ns(with_ranges) - per_call_ns(bare_loop)
    print(f"disabled nvtx.range: {cost:.0f} ns per call")
    assert cost < 1000


def test_torch_compile_traces_through_disabled_ranges():
    if compile_unsupported_reason(torch.device("cpu")):
        pytest.skip("torch.compile unavailable here")
    nvtx.disable()
    torch._dynamo.reset()

    def f(x):
        with nvtx.range("scores"):
            y = x * 2
        with nvtx.range("softmax"):
            return torch.softmax(y, dim=-1)

    x = torch.randn(4, 8)
    compiled = torch.compile(f, fullgraph=True, backend="eager")  # fullgraph: a graph break would raise
    torch.testing.assert_close(compiled(x), f(x))


def _fake_nsys(directory) -> str:
    path = directory / "nsys"
    path.write_text(
        "#!/usr/bin/env bash\n"
        'echo "nsys $*" >> "$FAKE_NSYS_LOG"\n'
        'case "$1" in\n'
        "  profile) touch \"$(printf '%s\\n' \"$@\" | sed -n 's/^--output=//p').nsys-rep\" ;;\n"
        '  stats) case " $* " in *" nvtx_gpu_proj_sum "*|*" cuda_api_sum "*|*" cudaapisum "*) exit 1 ;; esac; echo "report for: $*" ;;\n'
        "  --version) echo fake nsys ;;\n"
        "esac\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_nsys_script_profiles_the_measured_steps_of_benchmark(tmp_path):
    log = tmp_path / "log"
    env = dict(os.environ, NSYS=_fake_nsys(tmp_path), FAKE_NSYS_LOG=str(log), PYTHON="python")
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out" / "small"), "--model-size", "small", "--attention", "naive"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    profile = log.read_text().splitlines()[0]
    assert "--capture-range=cudaProfilerApi --capture-range-end=stop" in profile
    assert "--trace=cuda,nvtx,osrt" in profile
    assert profile.endswith(
        "python -m cs336_bench.benchmark --nvtx --no-profile-step --model-size small --attention naive"
    )
    assert "=== nvtx_sum" in result.stdout and "=== cuda_gpu_kern_sum" in result.stdout
    assert "=== nvtxgpuproj" in result.stdout  # an older nsys: the report's old name
    assert "=== cuda_api_sum: not available in this nsys" in result.stdout  # named, not fatal


def test_nsys_script_without_nsys_is_one_line_and_exit_2(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "x")], capture_output=True, text=True, env=env)
    if result.returncode != 2 or "nsys not found" not in result.stderr:
        pytest.skip("an nsys is installed in a standard folder on this machine")
    assert result.stderr.count("\n") == 1
    env["NSYS"] = str(tmp_path / "missing")
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "x")], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "is not an executable file" in result.stderr


def _run_script(tmp_path, *args, **env_changes):
    log = tmp_path / "log"
    env = dict(os.environ, NSYS=_fake_nsys(tmp_path), FAKE_NSYS_LOG=str(log), PYTHON="python", **env_changes)
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), *args], capture_output=True, text=True, env=env, timeout=60
    )
    return result, (log.read_text().splitlines()[0] if log.exists() else None)


def test_nsys_script_passes_extra_profile_options_through(tmp_path):
    result, profile = _run_script(
        tmp_path,
        "--nsys-args",
        "--pytorch=functions-trace,autograd-shapes-nvtx",
        "--cuda-memory-usage=true",
        "--",
        "--model-size",
        "small",
        "--nvtx",
        "blocks",
        NSYS_ARGS="--gpu-metrics-devices=all",
    )
    assert result.returncode == 0, result.stderr
    defaults, _, command = profile.partition(" python -m ")
    assert defaults.endswith(
        "--gpu-metrics-devices=all --pytorch=functions-trace,autograd-shapes-nvtx --cuda-memory-usage=true"
    )
    assert "--capture-range=cudaProfilerApi" in defaults  # extras come after the defaults, which stay
    assert command == "cs336_bench.benchmark --nvtx --no-profile-step --model-size small --nvtx blocks"


def test_nsys_script_without_closing_dashes_is_one_line_and_exit_2(tmp_path):
    result, profile = _run_script(tmp_path, "--nsys-args", "--cuda-memory-usage=true")
    assert result.returncode == 2 and profile is None
    assert result.stderr.count("\n") == 1 and "needs a closing --" in result.stderr


def test_block_ranges_only_with_blocks(fake_cuda):
    nvtx.enable()
    with nvtx.block(0):
        pass
    assert fake_cuda == [] and nvtx.block(0) is nvtx.block(1)
    nvtx.enable(blocks=True)
    with nvtx.block(3):
        pass
    assert fake_cuda == ["push block/3", "pop"]
    nvtx.disable()
    assert nvtx.block(0) is nvtx.range("x")  # off again, blocks included


def test_benchmark_run_with_block_ranges(recorded_ranges, monkeypatch):
    monkeypatch.setattr(nvtx, "_blocks", True)
    config = tiny_benchmark_config(pass_type="forward", warmup_steps=0, measure_steps=1, profile_step=False)
    record = runner.run_benchmark(config)
    assert record.status == "ok", record.error
    measured = recorded_ranges[recorded_ranges.index("measured") :]
    assert measured[:4] == ["measured", "step", "forward", "block/0"]
    assert measured.count("block/0") == measured.count("block/1") == 2  # the measured step, the memory step
