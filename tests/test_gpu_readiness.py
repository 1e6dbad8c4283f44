"""GPU paths checked on a CPU: CUDA-graph capture on a fake CUDA module, the graph row's
optimizer, loss check and capture-peak memory, checkpointing's RNG state, do_bench's
fallback and the nsys wrapper."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cs336_systems import benchmark, cuda_graphs, factory, models, runner
from cs336_systems.attention_bench.dobench import do_bench_samples
from cs336_systems.memory import PhaseMemory, memory_columns
from cs336_systems.models import ConfigError
from cs336_systems.optimizer import make_optimizer
from cs336_systems.results.records import NONFINITE_LOSS_NOTE, BenchmarkRecord
from tests.helpers import REPO, child_env, run_main, tiny_benchmark_config, tiny_model_config
from tests.tiny import TINY


def test_graph_optimizer_is_fused_and_capturable():
    model = factory.build_model(tiny_model_config(), "cpu")
    optimizer = make_optimizer(model, torch.device("cpu"), capturable=True)
    assert optimizer.defaults["fused"] is True and optimizer.defaults["capturable"] is True
    assert not optimizer.defaults["foreach"]


class FakeCuda:
    """Just enough of torch.cuda for CapturedStep, logging what it is asked to do."""

    def __init__(self, log):
        self.log = log

    def Stream(self):  # noqa: N802 (torch.cuda's name)
        return type("Stream", (), {"wait_stream": lambda self, other: None})()

    def current_stream(self):
        return self.Stream()

    def stream(self, stream):
        return contextlib.nullcontext()

    def synchronize(self):
        self.log.append("synchronize")

    def empty_cache(self):
        self.log.append("empty_cache")

    def CUDAGraph(self):  # noqa: N802
        self.log.append("CUDAGraph")
        return type("Graph", (), {"replay": lambda self: None})()

    @contextlib.contextmanager
    def graph(self, graph):
        self.log.append("capture begins")
        yield


def test_capture_starts_from_an_emptied_cache(monkeypatch):
    log = []
    monkeypatch.setattr(cuda_graphs.gc, "collect", lambda: log.append("gc.collect"))
    model = torch.nn.Linear(2, 2)

    def body():
        log.append("body")
        return torch.zeros(())

    @contextlib.contextmanager
    def phase(name):
        log.append(f"phase {name}")
        yield

    cuda_graphs.CapturedStep(body, model, warmup_iters=2, phase=phase, cuda=FakeCuda(log))
    assert log == [
        "phase eager",
        "body",
        "body",
        "gc.collect",
        "synchronize",
        "empty_cache",
        "phase capture",
        "CUDAGraph",
        "capture begins",
        "body",
    ]


def test_the_captured_steps_static_batch_lives_as_long_as_the_graph():
    """The graph reads its inputs by address: a batch freed after capture would be reused memory,
    and the replays would embed garbage token ids (seen on an H200 as a device-side assert)."""
    import gc
    import weakref

    model = torch.nn.Embedding(4, 4)  # (B, T) tokens -> (B, T, 4) logits
    batch = cuda_graphs.StaticBatch(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))
    tokens = weakref.ref(batch.tokens)
    body = cuda_graphs.step_body(model, batch, "forward", None, contextlib.nullcontext)
    step = cuda_graphs.CapturedStep(body, model, warmup_iters=1, cuda=FakeCuda([]))
    del batch, body
    gc.collect()
    assert tokens() is not None and step.graph is not None


def test_graph_row_peak_is_the_capture_peak():
    memory = PhaseMemory(torch.device("cpu"))
    memory.source = "cuda_allocator"  # as on a GPU
    gib = 1 << 30
    memory.steps = [{"eager": (9 * gib, 10 * gib), "capture": (8 * gib, 11 * gib)}, {"step": (3 * gib, 11 * gib)}]
    record = BenchmarkRecord.for_config(tiny_benchmark_config(cuda_graphs=True), torch.device("cpu"), None, 1)
    for column, value in memory_columns(memory, baseline=0).items():
        setattr(record, column, value)
    assert (record.peak_memory_bytes, record.peak_reserved_bytes) == (8 * gib, 11 * gib)
    assert record.first_step_peak_bytes == 9 * gib


class EagerStandIn:
    """CapturedStep's interface, run eagerly on a CPU: each call runs the body again."""

    def __init__(self, body, model, phase, **_):
        self.body = body
        with phase("eager"):
            self.loss = body()
        with phase("capture"):
            self.loss = body()

    def __call__(self):
        self.loss = self.body()


def test_graph_row_names_its_optimizer_and_checks_the_loss(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "CapturedStep", EagerStandIn)
    monkeypatch.setattr(cuda_graphs, "unsupported_reason", lambda *args: None)
    config = tiny_benchmark_config(cuda_graphs=True, pass_type="train-step", warmup_steps=0, measure_steps=1)
    model = factory.build_model(config.model, "cpu")
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    record = runner.run_benchmark(config, model=model, memory_baseline_bytes=0)
    assert record.status == "wrong" and NONFINITE_LOSS_NOTE in record.error
    assert record.optimizer == "torch.optim.adamw.AdamW (fused)"


def test_graphs_refuse_a_user_optimizer_in_one_line(capsys):
    code, out, err = run_main(
        benchmark.main, capsys, *TINY, "--cuda-graphs", "--pass-type", "train-step", "--optimizer", "torch.optim:SGD"
    )
    assert code == 2 and err.count("\n") == 1 and "cannot capture --optimizer" in err
    with pytest.raises(ConfigError, match="cannot capture --optimizer"):  # on any device
        tiny_benchmark_config(cuda_graphs=True, pass_type="train-step", optimizer_factory="torch.optim:SGD")


def test_checkpointed_blocks_do_not_save_rng_state(monkeypatch):
    calls = []
    real = models.checkpoint

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(models, "checkpoint", spy)
    model = factory.build_model(tiny_model_config(checkpoint_blocks=1), "cpu")
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    assert calls and all(kwargs.get("preserve_rng_state") is False for kwargs in calls)


@pytest.mark.parametrize("old_triton_error", [TypeError, AssertionError])
def test_do_bench_falls_back_for_older_tritons(old_triton_error):
    calls = []

    def do_bench(step, grad_to_none, **kwargs):
        calls.append(kwargs)
        if "return_mode" in kwargs:
            raise old_triton_error("return_mode")
        return 1.5

    assert do_bench_samples(do_bench, lambda: None, []) == [1.5] and len(calls) == 2


def nsys_run(tmp_path: Path, *flags: str, path: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """scripts/nsys_profile.sh with a fake nsys that logs its arguments."""
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir(exist_ok=True)
    log = tmp_path / "nsys.log"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" = stats ] && exit 1\nexit 0\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": path.replace("FAKE", str(fake.parent)), "PYTHON": sys.executable}
    env.pop("NSYS", None)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "nsys_profile.sh"), str(tmp_path / "out"), *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    return done, (log.read_text().splitlines() if log.exists() else [])


def test_nsys_profile_turns_the_profiled_step_off_and_traces_graph_nodes(tmp_path):
    done, lines = nsys_run(tmp_path, "--cuda-graphs", "--model-size", "small", path="FAKE:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    profile = lines[0].split()
    assert profile[0] == "profile" and "--cuda-graph-trace=node" in profile and "--no-profile-step" in profile
    done, lines = nsys_run(tmp_path, "--model-size", "small", path="FAKE:/usr/bin:/bin")
    eager = [line for line in lines if line.startswith("profile")][-1].split()
    assert "--no-profile-step" in eager and "--cuda-graph-trace=node" not in eager


def test_nsys_missing_is_one_line(tmp_path):
    done, _ = nsys_run(tmp_path, "--model-size", "small", path="/usr/bin:/bin")
    if done.returncode == 0:
        pytest.skip("an nsys is installed on this machine")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "nsys not found" in done.stderr


def test_gpu_selfcheck_runs_on_a_cpu_and_says_what_it_skipped(tmp_path):
    output = tmp_path / "check.md"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "checks" / "gpu_selfcheck.py"),
            "--device",
            "cpu",
            "--no-compile",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=child_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = output.read_text()
    assert "## Versions (ok" in text and f"torch {torch.__version__}" in text and "- git_commit:" in text
    assert "host user annotation" in text and "Optimizer.step#AdamW.step" in text
    assert "CUDA graph (skipped: needs a CUDA device" in text
    assert "aten::_scaled_dot_product" in text and "TFLOP/s measured" in text
    assert "USDT" not in done.stderr
