"""What the tests share besides their fixtures (conftest.py) and the tiny runs' flags (tiny.py): paths, tiny
configurations, a child process's environment and time limits, running a command's main in-process."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from cs336_systems.config import BenchmarkConfig
from cs336_systems.distributed import LaunchSpec
from cs336_systems.factory import build_model
from cs336_systems.models import ModelConfig

FIXTURES = Path(__file__).parent / "fixtures"
# two gloo ranks on the CPU, one thread each
SPEC = LaunchSpec("gloo", world_size=2, threads_per_rank=1, init_timeout_s=60, collective_timeout_s=60)
REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def tiny_model_config(**changes) -> ModelConfig:
    shape = dict(d_model=32, d_ff=64, num_layers=2, num_heads=2, vocab_size=97, context_length=16)
    shape.update(changes)
    return ModelConfig(**shape)


def tiny_benchmark_config(**changes) -> BenchmarkConfig:
    model_changes = {k: changes.pop(k) for k in list(changes) if k in ("attention", "vocab_size", "d_model")}
    # a model as long as the context asked (a configuration refuses a context longer than its model)
    model_changes["context_length"] = max(16, changes.get("context_length", 16))
    base = dict(
        model=tiny_model_config(**model_changes),
        context_length=16,
        batch_size=2,
        warmup_steps=1,
        measure_steps=3,
        device="cpu",
    )
    base.update(changes)
    return BenchmarkConfig(**base)


def lines_by_label(figure) -> dict[str, list]:
    """Each labelled line of `figure` (every axes): label -> [(x, y) points]."""
    lines: dict[str, list] = {}
    for axes in figure.axes:
        for line in axes.get_lines():
            points = [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)]
            lines.setdefault(line.get_label(), []).append(points)
    return lines


def child_env() -> dict[str, str]:
    """Environment for a child python that imports this checkout and the test fixtures."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(FIXTURES), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


# A test's guard against a hang, for a child process: far beyond any honest run on a loaded machine,
# far below the hangs tested (an hour). A test checks what ended a run (a status, a message), never
# how fast the machine ended it.
HANG_GUARD_S = 900


@functools.cache
def child_startup_s() -> float:
    """How long a child takes to start a tool here, now (python, torch, the harness): the unit a test
    scales a child's time limit by, so that a busy machine stretches the limit with the work."""
    start = time.monotonic()
    subprocess.run([PYTHON, "-c", "import cs336_systems.benchmark"], env=child_env(), check=True, timeout=HANG_GUARD_S)
    return time.monotonic() - start


def scaled_timeout(seconds: float) -> str:
    """A child's --timeout of at least `seconds`, and of ten startups where starting alone takes longer."""
    return f"{max(seconds, 10 * child_startup_s()):.0f}"


def run_main(main, capsys, *args) -> tuple[int, str, str]:
    """A command's main(argv) in this process: its exit status (argparse's usage exit too), stdout, stderr."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse exits on usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def single_process_step(config: BenchmarkConfig, world_size: int, lr: float):
    """The same SGD step in one process on the concatenated global batch, written independently:
    rank r's shard is drawn with seed + r (tokens, then targets), as step.make_step does."""
    torch.manual_seed(config.seed)
    model = build_model(config.model, config.device)
    initial = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    shards = []
    for rank in range(world_size):
        generator = torch.Generator(device=config.device).manual_seed(config.seed + rank)
        shape = (config.batch_size, config.context_length)
        tokens = torch.randint(0, config.model.vocab_size, shape, generator=generator, device=config.device)
        targets = torch.randint(0, config.model.vocab_size, shape, generator=generator, device=config.device)
        shards.append((tokens, targets))
    tokens, targets = (torch.cat(parts) for parts in zip(*shards))
    logits = model(tokens)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    torch.optim.SGD(model.parameters(), lr=lr).step()
    return initial, {name: p.detach().cpu() for name, p in model.named_parameters()}
