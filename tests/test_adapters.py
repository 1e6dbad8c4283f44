"""The adapters reader and the fixture adapters other tests benchmark (FlashAttention-2, DDP,
sharded optimizer, FSDP): the fixtures must be right, or the tests built on them prove nothing."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cs336_systems.adapters import (
    ADAPTERS_2025,
    ADAPTERS_2026,
    AdapterError,
    BadAdapter,
    MissingAdapter,
    NotImplementedAdapter,
    load_adapters,
)
from cs336_systems.distributed.group import find_free_port
from tests.helpers import FIXTURES


def test_a_path_and_a_dotted_name_load_the_same_adapters(fixtures_on_path):
    by_path = load_adapters(str(FIXTURES / "adapters_student.py"))
    by_name = load_adapters("adapters_student")
    assert set(by_path.functions) == set(by_name.functions) == set(ADAPTERS_2026) | set(ADAPTERS_2025)
    assert by_path.edition == "both"
    assert issubclass(by_path.flash_function("pytorch"), torch.autograd.Function)


def test_not_implemented_and_missing_adapters_are_told_apart(fixtures_on_path):
    student = load_adapters("adapters_student")
    with pytest.raises(NotImplementedAdapter, match="get_flashattention_autograd_function_triton"):
        student.flash_function("triton")
    skeleton = load_adapters("adapters_skeleton")
    assert skeleton.edition == "2026"
    arguments = {"get_ddp": 1, "get_fsdp": 1, "ddp_on_after_backward": 2, "fsdp_on_after_backward": 2}
    arguments["get_sharded_optimizer"] = 2
    for name in skeleton.functions:
        with pytest.raises(NotImplementedAdapter):
            skeleton.call(name, *[None] * arguments.get(name, 0))
    with pytest.raises(MissingAdapter, match="get_ddp_bucketed"):
        skeleton.call("get_ddp_bucketed", None, 1.0)


def test_an_adapter_returning_a_plain_function_is_a_bad_adapter(fixtures_on_path):
    with pytest.raises(BadAdapter, match="not a torch.autograd.Function"):
        load_adapters("adapters_wrong").flash_function("triton")


def test_a_wrapping_getter_that_returns_no_module_is_a_bad_adapter(tmp_path):
    """get_ddp returning 42 failed in every rank with "'int' object has no attribute 'parameters'"."""
    (tmp_path / "adapters.py").write_text("def get_ddp(module):\n    return 42\n")
    with pytest.raises(BadAdapter, match=r"get_ddp\(\) returned int 42, not a torch.nn.Module"):
        load_adapters(str(tmp_path / "adapters.py")).wrapper("get_ddp", torch.nn.Linear(1, 1))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("broken_import", "cannot import 'broken_import': ImportError: this module cannot be imported"),
        (str(FIXTURES / "broken_import.py"), "cannot import '.*broken_import.py': ImportError"),
        ("no_such_module_here", "cannot import 'no_such_module_here': ModuleNotFoundError"),
        ("missing/adapters.py", "no such file"),
        ("adapters_none", "defines none of the official adapter functions"),
    ],
)
def test_unusable_modules_are_one_line_errors(spec, message, fixtures_on_path):
    with pytest.raises(AdapterError, match=message) as caught:
        load_adapters(spec)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("shape, causal", [((2, 37, 16), True), ((2, 37, 16), False), ((1, 2, 40, 8), True)])
def test_fixture_flash_attention_matches_sdpa_forward_and_backward(shape, causal, fixtures_on_path):
    flash = load_adapters("adapters_student").flash_function("pytorch")
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=generator, requires_grad=True) for _ in range(3))
    out = flash.apply(q, k, v, causal)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad_out = torch.randn(shape, generator=generator)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    reference_grads = torch.autograd.grad(reference, (q, k, v), grad_out)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    for grad, expected in zip(grads, reference_grads):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def _train(model, optimizer, x, y, after_backward=lambda: None, steps=3):
    for _ in range(steps):
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        after_backward()
        optimizer.step()


def _data_parallel_worker(rank: int, world: int, port: int, queue) -> None:
    import adapters_student as student

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randn(8, 3)
    reference = _model()
    _train(reference, torch.optim.AdamW(reference.parameters(), lr=0.1), x, y)
    expected = [p.detach() for p in reference.parameters()]
    local = slice(rank * 4, rank * 4 + 4)  # each rank its half of the global batch
    errors = {}

    model = _model()
    if rank == 1:  # different start: DDP must broadcast rank 0's
        torch.nn.init.zeros_(model[0].weight)
    ddp = student.get_ddp(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=0.1)
    _train(ddp, optimizer, x[local], y[local], lambda: student.ddp_on_after_backward(ddp, optimizer))
    errors["ddp"] = max((a - b).abs().max().item() for a, b in zip(ddp.module.parameters(), expected))

    model = _model()
    _train(model, student.get_sharded_optimizer(model.parameters(), torch.optim.AdamW, lr=0.1), x, y)
    errors["sharded"] = max((a - b).abs().max().item() for a, b in zip(model.parameters(), expected))

    fsdp = student.get_fsdp(_model())
    optimizer = torch.optim.AdamW(fsdp.parameters(), lr=0.1)
    _train(fsdp, optimizer, x[local], y[local], lambda: student.fsdp_on_after_backward(fsdp, optimizer))
    full = student.fsdp_gather_full_params(fsdp)
    errors["fsdp"] = max((a - b).abs().max().item() for a, b in zip(full.values(), expected))
    errors["fsdp_shard_numel"] = sum(p.numel() for p in fsdp.parameters())
    queue.put((rank, errors))
    dist.destroy_process_group()


def test_fixture_data_parallel_classes_train_like_one_process_on_the_global_batch(fixtures_on_path):
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = find_free_port()
    processes = [context.Process(target=_data_parallel_worker, args=(rank, 2, port, queue)) for rank in range(2)]
    env_before = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(FIXTURES), env_before])
    try:
        for process in processes:
            process.start()
        results = dict(queue.get(timeout=120) for _ in processes)
    finally:
        os.environ["PYTHONPATH"] = env_before
        for process in processes:
            process.join(timeout=30)
    full_numel = sum(p.numel() for p in _model().parameters())
    for rank in (0, 1):
        assert results[rank]["ddp"] < 1e-5
        assert results[rank]["sharded"] < 1e-5
        assert results[rank]["fsdp"] < 1e-5
        assert results[rank]["fsdp_shard_numel"] < full_numel  # each rank holds about half
