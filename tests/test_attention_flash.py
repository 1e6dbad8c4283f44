"""attention_bench with the student's code: FlashAttention-2 from an adapters module, the check
against the fp32 reference, skipped and bad adapters, crashing and wrong-shape implementations,
--timer do-bench and its fallbacks, 3-D inputs, CLI errors."""

from __future__ import annotations

import json
import sys
import types

import pandas as pd
import pytest
import torch

from cs336_systems import attention_bench
from cs336_systems.adapters import load_adapters
from cs336_systems.attention_bench import AttentionConfig, check, correctness, dobench, reference, run_attention
from tests.helpers import FIXTURES

PROG = "python -m cs336_systems.attention_bench"
STUDENT = str(FIXTURES / "adapters_student.py")
WRONG = str(FIXTURES / "adapters_wrong.py")


def tiny(implementation="naive", **changes) -> AttentionConfig:
    base = dict(
        implementation=implementation, head_dim=8, context_length=40, batch_size=2, warmup_steps=1, measure_steps=2
    )
    base.update(changes)
    return AttentionConfig(**base)


@pytest.mark.parametrize("layout, heads", [("bsd", 1), ("bhsd", 2)])
@pytest.mark.parametrize("causal", [True, False])
def test_fixture_flash_pytorch_is_checked_and_timed(layout, heads, causal):
    config = tiny("flash-pytorch", layout=layout, num_heads=heads, causal=causal, adapters=STUDENT)
    record = run_attention(config)
    assert record.status == "ok", record.error
    assert record.max_abs_err_out < 1e-5 and record.max_abs_err_grad < 1e-5 and record.check_tolerance == 1e-4
    assert record.forward_steps == record.backward_steps == record.end_to_end_steps == 2
    assert len(record.end_to_end_samples_ms) == 2 and record.end_to_end_mean_ms > 0
    assert record.timer_used == "host" and record.adapters == STUDENT
    assert record.forward_flops == 4 * 2 * heads * 40 * 40 * 8
    assert record.end_to_end_tflops == pytest.approx(
        3 * record.forward_flops / (record.end_to_end_mean_ms / 1e3) / 1e12
    )


@pytest.mark.parametrize("implementation", ["naive", "sdpa"])
def test_builtins_pass_the_check_in_3d_and_without_the_mask(implementation):
    record = run_attention(tiny(implementation, layout="bsd", causal=False))
    assert record.status == "ok" and record.max_abs_err_out < 1e-5 and record.max_abs_err_grad < 1e-5


def test_bf16_is_checked_at_its_own_tolerance():
    record = run_attention(tiny("flash-pytorch", precision="bf16", adapters=STUDENT, measure_steps=1, warmup_steps=0))
    assert record.status == "ok", record.error
    assert record.check_tolerance == 3e-2 and 1e-4 < record.max_abs_err_out < 3e-2  # bf16 rounding, not fp32's


def test_a_wrong_output_is_a_wrong_row_that_is_still_timed():
    record = run_attention(tiny("flash-pytorch", adapters=WRONG))
    assert record.status == "wrong"
    assert record.error.startswith("differs from the fp32 naive reference: out: ") and "dq" in record.error
    assert record.max_abs_err_out > 1e-2 and record.forward_mean_ms > 0 and record.end_to_end_mean_ms > 0


def test_a_wrong_gradient_alone_is_caught(fixtures_on_path):
    record = run_attention(tiny("adapters_wrong:WrongGradient"))
    assert record.status == "wrong" and record.max_abs_err_out < 1e-5 and record.max_abs_err_grad > 1e-2
    assert "dq: " in record.error and "out:" not in record.error and "dk" not in record.error


def test_check_tolerance_scales_with_the_reference():
    expected = torch.full((4,), 100.0)
    grads = (torch.zeros(4),) * 3
    assert not check(expected + 9e-3, grads, expected, grads, "fp32").wrong  # 1e-4 x 100 = 1e-2 allowed
    result = check(expected + 2e-2, grads, expected, grads, "fp32")
    assert result.wrong and result.failures == ("out: 0.02 > 0.01",)
    assert check(expected, (torch.full((4,), 2e-4), *grads[1:]), expected, grads, "fp32").failures[0].startswith("dq")
    assert check(expected.nan_to_num(), grads, expected * float("nan"), grads, "fp32").wrong  # NaN is never right


def test_the_chunked_reference_equals_one_pass(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 3, 50, 8, generator=generator) for _ in range(4))
    whole_out, whole_grads = reference(q, k, v, grad_out, True)
    monkeypatch.setattr(correctness, "REFERENCE_CHUNK_ELEMENTS", 6 * 50 * 7)  # 7 query rows per chunk
    out, grads = reference(q, k, v, grad_out, True)
    sdpa_q, sdpa_k, sdpa_v = (t.clone().requires_grad_() for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention(sdpa_q, sdpa_k, sdpa_v, is_causal=True)
    torch.testing.assert_close(out, whole_out)
    torch.testing.assert_close(out, sdpa.detach())
    for got, whole, expected in zip(grads, whole_grads, torch.autograd.grad(sdpa, (sdpa_q, sdpa_k, sdpa_v), grad_out)):
        torch.testing.assert_close(got, whole)
        torch.testing.assert_close(got, expected)


def test_not_implemented_adapters_are_skipped_rows():
    skeleton = str(FIXTURES / "adapters_skeleton.py")
    for implementation in ("flash-pytorch", "flash-triton"):
        record = run_attention(tiny(implementation, adapters=skeleton))
        assert record.status == "skipped" and "not implemented yet" in record.error
        assert record.forward_mean_ms is None
    # asked before the device: on a CPU the student's unwritten Triton kernel is skipped, a written one unsupported
    student = run_attention(tiny("flash-triton", adapters=STUDENT))
    assert student.status == "skipped"


def test_an_adapter_that_is_not_an_autograd_function_is_an_error_row():
    record = run_attention(tiny("flash-triton", adapters=WRONG))
    assert record.status == "error" and record.error.startswith("setup: BadAdapter: ")
    assert "not a torch.autograd.Function" in record.error and "\n" not in record.error


def test_crashing_and_wrong_shape_implementations_are_rows_and_the_others_still_run(tmp_path, capsys, fixtures_on_path):
    csv = tmp_path / "a.csv"
    args = ["--device", "cpu", "--head-dims", "8", "--context-lengths", "32", "--measure-steps", "1"]
    args += ["--implementations", "adapters_wrong:crashes", "naive", "adapters_wrong:wrong_shape", "sdpa"]
    code = attention_bench.main(args + ["--output", str(csv)])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err + out
    frame = pd.read_csv(csv).set_index("implementation")
    assert frame.loc["adapters_wrong:crashes", "status"] == "error"
    assert frame.loc["adapters_wrong:crashes", "error"] == (
        "forward: RuntimeError: index out of range in the student's kernel"
    )
    assert frame.loc["adapters_wrong:wrong_shape", "status"] == "wrong"
    assert (
        frame.loc["adapters_wrong:wrong_shape", "error"]
        == "forward: output shape (1, 1, 31, 8), expected (1, 1, 32, 8) (that of q)"
    )
    assert frame.loc["naive", "status"] == frame.loc["sdpa", "status"] == "ok"


def test_cli_with_adapters_runs_the_flash_implementations_by_default(tmp_path, capsys):
    jsonl = tmp_path / "a.jsonl"
    args = ["--device", "cpu", "--adapters", STUDENT, "--head-dims", "8", "--context-lengths", "32"]
    args += ["--measure-steps", "1", "--warmup-steps", "0", "--layout", "bsd", "--precisions", "fp32", "bf16"]
    code = attention_bench.main(args + ["--output", str(jsonl)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    got = {(row["precision"], row["implementation"]): row["status"] for row in rows}
    assert set(got) == {
        (p, i) for p in ("fp32", "bf16") for i in ("naive", "sdpa", "compiled", "flash-pytorch", "flash-triton")
    }
    assert got[("fp32", "flash-pytorch")] == "ok" and got[("fp32", "flash-triton")] == "skipped"
    assert {row["adapters"] for row in rows if row["implementation"].startswith("flash")} == {STUDENT}
    assert all(row["batch_size"] == 1 and row["causal"] is True and row["layout"] == "bsd" for row in rows)


def test_defaults_are_the_handouts():
    args = attention_bench.build_parser().parse_args([])
    assert (args.batch_size, args.num_heads, args.causal, args.precisions) == (1, 1, True, ["fp32"])
    assert args.measure_steps == 100 and args.max_seconds == 0  # the budget is opt-in
    [config, *_] = attention_bench.configs_from_args(args, torch.device("cpu"))
    assert config.max_seconds == 0 and config.measure_steps == 100
    assert attention_bench.build_parser().parse_args(["--no-causal"]).causal is False


def test_do_bench_without_triton_falls_back_to_the_host_loop_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    record = run_attention(tiny("naive", timer="do-bench"))
    assert record.status == "ok" and record.timer == "do-bench" and record.timer_used == "host"
    assert "--timer do-bench: Triton is not importable; timed with the host loop instead" in record.notes
    assert record.forward_steps == 2


def test_do_bench_with_triton_but_no_cuda_falls_back_too(monkeypatch):
    fake = types.ModuleType("triton.testing")
    fake.do_bench = lambda *args, **kwargs: pytest.fail("do_bench must not run without CUDA")
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.testing", fake)
    assert dobench.do_bench_backend(torch.device("cpu")) == (
        "host",
        None,
        "--timer do-bench: Triton's do_bench needs a CUDA device; timed with the host loop instead",
    )
    assert dobench.do_bench_backend(torch.device("cuda"))[:2] == (dobench.TRITON, fake.do_bench)


def test_do_bench_samples_and_cleared_gradients_are_recorded(monkeypatch):
    calls = []

    def fake_do_bench(step, grad_to_none=None, return_mode="mean"):
        step()
        calls.append((return_mode, [t.grad is not None for t in grad_to_none]))
        for tensor in grad_to_none:
            tensor.grad = None
        return [1.0, 2.0, 3.0, 4.0]

    monkeypatch.setattr(
        attention_bench.measure, "do_bench_backend", lambda device: (dobench.TRITON, fake_do_bench, None)
    )
    record = run_attention(tiny("naive", timer="do-bench", measure_steps=100))
    assert record.status == "ok" and record.timer_used == "triton.do_bench"
    assert (
        record.forward_samples_ms == record.backward_samples_ms == record.end_to_end_samples_ms == [1.0, 2.0, 3.0, 4.0]
    )
    assert record.forward_mean_ms == 2.5 and record.end_to_end_steps == 4
    assert record.notes is None or "of 100 steps" not in record.notes  # do_bench picks its own count
    # forward leaves no gradients; backward and end-to-end do, and do_bench is told to clear them
    assert calls == [("all", [False] * 3), ("all", [True] * 3), ("all", [True] * 3)]


def test_old_triton_without_return_mode_gives_one_sample():
    def old_do_bench(step, grad_to_none=None):
        step()
        return 0.5

    assert dobench.do_bench_samples(old_do_bench, lambda: None, []) == [0.5]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--implementations", "flash-pytorch"], "--implementations flash-pytorch needs --adapters MODULE"),
        (["--adapters", "broken_import"], "--adapters broken_import: cannot import 'broken_import': ImportError"),
        (["--adapters", "adapters_none"], "defines none of the official adapter functions"),
        (["--adapters", "nowhere/adapters.py"], "--adapters nowhere/adapters.py: no such file"),
        (["--implementations", "no_such_mod:attend"], "cannot import 'no_such_mod'"),
        (["--implementations", "flash"], "invalid choice: 'flash'"),
        (["--layout", "bsd", "--num-heads", "2"], "--layout bsd has no head axis"),
        (["--timer", "do-bench", "--precisions", "fp8"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message, fixtures_on_path):
    try:
        code = attention_bench.main(["--device", "cpu", "--context-lengths", "16", *args])
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert err.startswith(f"{PROG}: error:")


def test_adapters_object_is_reused_by_the_rows():
    adapters = load_adapters(STUDENT)
    record = run_attention(tiny("flash-pytorch"), adapters=adapters)
    assert record.status == "ok" and record.adapters is None  # the config names no module; the object came in


def test_markdown_shows_small_errors_instead_of_zeros():
    record = run_attention(tiny("sdpa", measure_steps=1, warmup_steps=0))
    markdown = attention_bench.AttentionRecord.markdown([record.to_row()])
    assert f"{record.max_abs_err_out:.2e}" in markdown and 0 < record.max_abs_err_out < 1e-5


def test_do_bench_times_a_compiled_backward_over_one_retained_graph(monkeypatch):
    """do_bench calls backward many times on one graph (retain_graph=True); a compiled backward
    that donates its buffers refuses that (torch 2.11 on CUDA), so the row compiles without them."""
    donated = []

    def fake_do_bench(step, grad_to_none=(), return_mode="all"):
        donated.append(torch._functorch.config.donated_buffer)
        step(), step()
        return [1.0, 1.0]

    monkeypatch.setattr(attention_bench.measure, "do_bench_backend", lambda device: ("do-bench", fake_do_bench, None))
    record = run_attention(tiny("compiled", timer="do-bench"))
    assert record.status == "ok", record.error
    assert donated == [False, False, False] and torch._functorch.config.donated_buffer  # restored after the row
