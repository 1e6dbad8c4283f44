import json
import math
import subprocess

import pytest
import torch

from cs336_systems import runner
from cs336_systems.config import PASS_TYPES
from cs336_systems.device import compile_unsupported_reason, is_out_of_memory
from cs336_systems.precision import cpu_has_native
from cs336_systems.runner import OPTIMIZER_STATE_NOTE, run_benchmark
from tests.helpers import HANG_GUARD_S, PYTHON, child_env, tiny_benchmark_config
from tests.tiny import TINY


@pytest.mark.parametrize("pass_type", PASS_TYPES)
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_pass_type_and_cpu_precision_runs(pass_type, precision):
    record = run_benchmark(tiny_benchmark_config(pass_type=pass_type, precision=precision))
    assert record.status == "ok", record.error
    assert len(record.step_ms) == 3 and len(record.warmup_step_ms) == 1
    assert record.mean_ms > 0 and record.min_ms <= record.median_ms <= record.max_ms
    assert record.tokens_per_s == pytest.approx(2 * 16 / (record.median_ms / 1e3))
    assert record.num_params > 0
    assert record.autocast_dtype == {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}[precision]
    assert record.grad_scaler is (precision == "fp16")
    assert record.matmul_precision == "highest" and record.cuda_matmul_allow_tf32 is False


def test_tf32_is_unsupported_on_cpu():
    record = run_benchmark(tiny_benchmark_config(precision="tf32"))
    assert record.status == "unsupported" and "TF32" in record.error
    assert record.mean_ms is None


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_emulated_half_precision_on_cpu_is_noted(precision):
    record = run_benchmark(tiny_benchmark_config(precision=precision, pass_type="forward"))
    assert (f"no native {precision} matmul" in (record.notes or "")) is not cpu_has_native(precision)


def test_forward_runs_without_autograd(monkeypatch):
    seen = []
    original = runner.make_step

    def spying_make_step(config, model, device, optimizer=None, **kwargs):
        model.register_forward_hook(lambda module, args, out: seen.append((torch.is_grad_enabled(), out.requires_grad)))
        return original(config, model, device, optimizer, **kwargs)

    monkeypatch.setattr(runner, "make_step", spying_make_step)
    run_benchmark(tiny_benchmark_config(pass_type="forward"))
    assert seen and all(not grad and not requires for grad, requires in seen)


def test_train_step_actually_updates_weights():
    config = tiny_benchmark_config(pass_type="train-step")
    model = runner.build_model(config.model, "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    record = run_benchmark(config, model=model)
    assert record.status == "ok"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # released after the run


def test_zero_warmup_train_step_says_optimizer_state_is_included():
    record = run_benchmark(tiny_benchmark_config(pass_type="train-step", warmup_steps=0))
    assert OPTIMIZER_STATE_NOTE in record.notes
    # (other notes, such as a busy machine's MFU peak, depend on the moment)
    assert OPTIMIZER_STATE_NOTE not in (
        run_benchmark(tiny_benchmark_config(pass_type="train-step", warmup_steps=1)).notes or ""
    )


def test_seed_makes_inputs_reproducible():
    config = tiny_benchmark_config(pass_type="forward")
    model = runner.build_model(config.model, "cpu")
    outputs = []
    model.register_forward_hook(lambda module, args, out: outputs.append(args[0].clone()))
    run_benchmark(config, model=model)
    run_benchmark(config, model=model)
    assert torch.equal(outputs[0], outputs[-1])


def test_injected_oom_during_step_is_a_result(monkeypatch):
    def exploding_make_step(*args, **kwargs):
        def step():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail")

        return step

    monkeypatch.setattr(runner, "make_step", exploding_make_step)
    record = run_benchmark(tiny_benchmark_config())
    assert record.status == "oom"
    assert record.error == "CUDA out of memory. Tried to allocate 20.00 GiB"
    assert math.isnan(record.mean_ms or math.nan)


def test_injected_cpu_allocator_failure_while_building(monkeypatch):
    def failing_build(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes"
        )

    monkeypatch.setattr(runner, "build_model", failing_build)
    record = run_benchmark(tiny_benchmark_config())
    assert record.status == "oom" and "can't allocate memory" in record.error
    assert record.num_params is not None  # counted on the meta device before building
    # the process carries on: the next configuration still runs
    monkeypatch.undo()
    assert run_benchmark(tiny_benchmark_config()).status == "ok"


def test_other_failures_are_errors(monkeypatch):
    monkeypatch.setattr(runner, "make_step", lambda *a, **k: (_ for _ in ()).throw(KeyError("surprise")))
    record = run_benchmark(tiny_benchmark_config())
    assert record.status == "error" and record.error.startswith("KeyError")


@pytest.mark.parametrize(
    ("exc", "is_oom"),
    [
        (MemoryError(), True),
        (torch.OutOfMemoryError("x"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("can't allocate memory"), False),
    ],
)
def test_oom_classification(exc, is_oom):
    assert is_out_of_memory(exc) is is_oom


def test_user_model_factory_end_to_end(fixtures_on_path):
    record = run_benchmark(tiny_benchmark_config(model_factory="user_models:make_model", pass_type="train-step"))
    assert record.status == "ok", record.error
    assert record.model_factory == "user_models:make_model"
    assert record.num_params == 97 * 32 + 32 * 97 + 97


def test_user_model_with_wrong_output_is_an_error_row(fixtures_on_path):
    record = run_benchmark(tiny_benchmark_config(model_factory="user_models:wrong_shape"))
    assert record.status == "error"
    assert "expected floating (B, T, V)" in record.error


@pytest.mark.slow
def test_compile_measures_compile_time_apart():
    if compile_unsupported_reason(torch.device("cpu")):
        pytest.skip("torch.compile unavailable here")
    record = run_benchmark(tiny_benchmark_config(compile=True, pass_type="forward", warmup_steps=1, measure_steps=2))
    assert record.status == "ok", record.error
    assert record.compile_s > 0
    # the compile call is a step of its own: neither a warmup nor a measured one (a busy machine's slow
    # step may take as long as compiling: counted, not timed)
    assert len(record.warmup_step_ms) == 1 and len(record.step_ms) == 2


@pytest.mark.slow
def test_a_compile_killed_mid_build_does_not_poison_the_next_one(tmp_path):
    """A stage limit killed a compile mid-build: it left zero-byte .so files in torch's inductor cache (by
    hand: a compile child's process group SIGKILLed while g++ wrote main.so), and every later compile of the
    same graph failed with "ImportError: ...main.so: file too short". The next run removes them and compiles
    again, and its row says so."""
    if compile_unsupported_reason(torch.device("cpu")):
        pytest.skip("torch.compile unavailable here")
    output = tmp_path / "row.jsonl"
    flags = ["--compile", "--pass-type", "forward", "--warmup-steps", "0", "--measure-steps", "1", "--output"]
    command = [PYTHON, "-m", "cs336_systems.benchmark", *TINY, *flags, str(output)]
    cache = {**child_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    rows = []
    for run in ("builds the cache", "finds it damaged"):
        output.unlink(missing_ok=True)
        result = subprocess.run(command, env=cache, capture_output=True, text=True, timeout=HANG_GUARD_S)
        rows.append(json.loads(output.read_text()))
        assert rows[-1]["status"] == "ok", (run, result.stderr)
        built = [path for path in (tmp_path / "inductor").rglob("*.so") if path.stat().st_size]
        for path in built if run == "builds the cache" else ():
            path.write_bytes(b"")  # what the kill leaves: each file made, nothing written into it
    assert rows[0]["notes"] is None or "inductor cache" not in rows[0]["notes"]
    assert "unfinished file(s) of a compile killed mid-build from torch's inductor cache" in rows[1]["notes"]
    assert not [path for path in (tmp_path / "inductor").rglob("*.so") if not path.stat().st_size]


def test_only_unfinished_files_no_build_holds_are_removed_and_a_call_failing_on_one_runs_again(tmp_path, monkeypatch):
    from filelock import FileLock

    from cs336_systems.step import compiling

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    (tmp_path / "ab").mkdir()
    (tmp_path / "cd").mkdir()
    elf = b"\x7fELF" + bytes(60)
    files = {"ab/cab.main.so": b"", "ab/cab.main.o": b"\x7fEL", "ab/cab.kernel.o": elf, "ab/cab.cpp": b""}
    files |= {"cd/ccd.so": b"", "cd/cef.so": elf}  # ccd: being built by another process (its lock held)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    calls, notes = [], []

    def first_call():  # cef.so has an ELF header but is cut short after it: the loader says so
        calls.append(1)
        if len(calls) == 1:
            raise ImportError(f"{tmp_path / 'cd' / 'cef.so'}: ELF load command past end of file")
        return 7

    with FileLock(tmp_path / "locks" / "ccd.lock"):
        assert compiling(first_call, notes) == 7 and len(calls) == 2
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.glob("??/*")) == [
        "ab/cab.cpp",
        "ab/cab.kernel.o",
        "cd/ccd.so",
    ]
    assert notes == ["removed 3 unfinished file(s) of a compile killed mid-build from torch's inductor cache"]
    with pytest.raises(ValueError, match="a bug of the step"):  # a failure on nothing of the cache is raised
        compiling(lambda: (_ for _ in ()).throw(ValueError("a bug of the step")), [])


@pytest.mark.slow
def test_regional_compile_restores_the_blocks():
    if compile_unsupported_reason(torch.device("cpu")):
        pytest.skip("torch.compile unavailable here")
    config = tiny_benchmark_config(compile=True, compile_scope="blocks", pass_type="forward", measure_steps=2)
    model = runner.build_model(config.model, "cpu")
    blocks = list(model.layers)
    record = run_benchmark(config, model=model)
    assert record.status == "ok", record.error
    assert record.compile_scope == "blocks" and record.compile_s > 0
    assert list(model.layers) == blocks  # a reused model is eager again


def test_blocks_scope_needs_layers(fixtures_on_path):
    config = tiny_benchmark_config(compile=True, compile_scope="blocks", model_factory="user_models:make_model")
    record = run_benchmark(config)
    assert record.status == "error" and "needs a model whose blocks are in a `layers` ModuleList" in record.error
