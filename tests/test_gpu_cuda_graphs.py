"""--cuda-graphs on a real CUDA device: replays compute what eager steps compute. Skipped without CUDA."""

import contextlib
import copy

import pytest
import torch

from cs336_systems import cuda_graphs
from cs336_systems.factory import build_model
from tests.helpers import tiny_model_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("pass_type", ["train-step", "forward-backward", "forward"])
def test_replayed_steps_match_eager_steps(pass_type):
    torch.manual_seed(0)
    device = torch.device("cuda")
    config = tiny_model_config()
    eager_model = build_model(config, device)
    graphed_model = copy.deepcopy(eager_model)
    generator = torch.Generator(device=device).manual_seed(0)
    batches = [
        (
            torch.randint(0, config.vocab_size, (2, 16), device=device, generator=generator),
            torch.randint(0, config.vocab_size, (2, 16), device=device, generator=generator),
        )
        for _ in range(cuda_graphs.CAPTURE_WARMUP_ITERS + 4)
    ]
    training = pass_type == "train-step"
    eager_opt = cuda_graphs.make_optimizer(eager_model) if training else None
    graphed_opt = cuda_graphs.make_optimizer(graphed_model) if training else None

    static = cuda_graphs.StaticBatch(batches[0][0].clone(), batches[0][1].clone())
    body = cuda_graphs.step_body(graphed_model, static, pass_type, graphed_opt, contextlib.nullcontext)
    step = cuda_graphs.CapturedStep(body, graphed_model)  # the warmup iterations all use batches[0]

    eager_static = cuda_graphs.StaticBatch(batches[0][0].clone(), batches[0][1].clone())
    eager_body = cuda_graphs.step_body(eager_model, eager_static, pass_type, eager_opt, contextlib.nullcontext)
    for _ in range(cuda_graphs.CAPTURE_WARMUP_ITERS):
        eager_model.zero_grad(set_to_none=True)
        eager_body()

    for tokens, targets in batches[1:]:
        static.load(tokens, targets)
        step()
        eager_static.load(tokens, targets)
        eager_model.zero_grad(set_to_none=True)
        eager_loss = eager_body()
        torch.testing.assert_close(step.loss, eager_loss, rtol=1e-5, atol=1e-6)
    for graphed, eager in zip(graphed_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(graphed, eager, rtol=1e-5, atol=1e-6)
        if pass_type != "forward":
            torch.testing.assert_close(graphed.grad, eager.grad, rtol=1e-5, atol=1e-6)


def test_cuda_graph_benchmark_row():
    from cs336_systems.runner import run_benchmark
    from tests.helpers import tiny_benchmark_config

    record = run_benchmark(
        tiny_benchmark_config(device="cuda", pass_type="train-step", cuda_graphs=True, measure_steps=5, peak_tflops=1.0)
    )
    assert record.status == "ok", record.error
    assert record.cuda_graphs is True and len(record.step_ms) == 5
    assert record.forward_mean_ms is None  # one replay: no phases
    assert record.kernels_per_step > 0 and 0 < record.device_busy_pct <= 100
    assert record.optimizer == "torch.optim.adamw.AdamW (fused)"
    # the capture's peak holds the graph pool (activations, grads), as an eager step's peak does
    eager = run_benchmark(tiny_benchmark_config(device="cuda", pass_type="train-step", measure_steps=2))
    assert record.peak_memory_bytes >= 0.9 * eager.peak_memory_bytes


def test_checkpointed_blocks_capture_and_replay():
    from cs336_systems.runner import run_benchmark
    from tests.helpers import tiny_benchmark_config

    config = tiny_benchmark_config(device="cuda", pass_type="train-step", cuda_graphs=True, measure_steps=3)
    record = run_benchmark(config.replace(model=config.model.replace(checkpoint_blocks=1)))
    assert record.status == "ok", record.error


def test_profiled_step_on_a_gpu_counts_kernels_not_annotations():
    from cs336_systems.profiling import profile_step

    model = build_model(tiny_model_config(), "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    tokens = torch.randint(0, 97, (2, 16), device="cuda")

    def step():
        model(tokens).sum().backward()
        optimizer.step()

    step()
    profile = profile_step(step, torch.device("cuda"), torch.cuda.synchronize)
    names = [k["name"] for k in profile.top_kernels]
    assert not any(name.startswith("Optimizer.step") for name in names)
    assert 0 < profile.device_busy_pct <= 100
