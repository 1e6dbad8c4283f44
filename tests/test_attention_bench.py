"""attention_bench on CPU with tiny shapes: rows, memory, FLOPs, OOM rows, CLI errors, plot."""

import json
import math
import re
import subprocess

import pandas as pd
import pytest
import torch

from cs336_systems import attention_bench
from cs336_systems.attention_bench import AttentionConfig, run_attention, saved_tensor_bytes
from cs336_systems.attention_bench import run as attention_run
from cs336_systems.device import compile_unsupported_reason
from cs336_systems.layers import naive_causal_attention, sdpa_causal_attention
from cs336_systems.memory_cap import soft_address_space_cap
from tests.helpers import PYTHON, child_env

PROG = "python -m cs336_systems.attention_bench"


def tiny(implementation="naive", **changes) -> AttentionConfig:
    base = dict(
        implementation=implementation, head_dim=8, context_length=32, batch_size=2, warmup_steps=1, measure_steps=3
    )
    base.update(changes)
    return AttentionConfig(**base)


def test_naive_row_times_both_passes_and_counts_what_autograd_saves():
    config = tiny("naive")
    record = run_attention(config)
    assert record.status == "ok", record.error
    assert record.forward_steps == record.backward_steps == 3
    assert len(record.forward_samples_ms) == len(record.backward_samples_ms) == 3 and len(record.forward_warmup_ms) == 1
    assert 0 < record.forward_min_ms <= record.forward_mean_ms <= record.forward_max_ms
    assert record.backward_mean_ms > 0 and record.compile_s is None
    B, T, d = 2, 32, 8
    assert record.forward_flops == 4 * B * T * T * d and record.backward_flops == 2 * record.forward_flops
    assert record.forward_tflops == pytest.approx(
        record.forward_flops / (record.forward_median_ms / 1e3) / 1e12
    )  # rates on the median
    assert record.scores_bytes == B * T * T * 4
    # q, k, v (fp32) + softmax probabilities (B, 1, T, T) + the boolean causal mask (T, T)
    assert record.saved_for_backward_bytes == 3 * B * T * d * 4 + B * T * T * 4 + T * T
    assert record.memory_source == "rss peaks; live tensors before backward"
    # on a CPU, what is live before backward: the saved storages (inputs among them), grad_out and the output
    assert record.memory_before_backward_bytes == record.saved_for_backward_bytes + 2 * B * T * d * 4
    assert record.matmul_precision == "highest" and record.cuda_matmul_allow_tf32 is False


def test_sdpa_saves_no_score_matrix():
    q, k, v = (torch.randn(2, 1, 64, 8, requires_grad=True) for _ in range(3))
    naive, fused = (
        saved_tensor_bytes(naive_causal_attention, q, k, v),
        saved_tensor_bytes(sdpa_causal_attention, q, k, v),
    )
    assert naive >= 2 * 64 * 64 * 4  # the (T, T) probabilities
    assert fused < 2 * 64 * 64 * 4  # q, k, v, output and log-sum-exp: O(T)
    record = run_attention(tiny("sdpa", context_length=64))
    assert record.status == "ok" and record.saved_for_backward_bytes == fused
    assert record.sdpa_backend in (None, "flash_attention", "math", "efficient_attention")


def test_backward_is_timed_without_its_forward(monkeypatch):
    """A fake clock advances 5 s per forward and 1 ms per backward: only the backward counts."""
    clock = {"now": 0.0}

    def attend(q, k, v):
        clock["now"] += 5.0
        return naive_causal_attention(q, k, v)

    monkeypatch.setattr(attention_bench.measure, "attention_for", lambda config, adapters=None: attend)
    monkeypatch.setattr(torch.Tensor, "backward", _advancing_backward(torch.Tensor.backward, clock))
    record = run_attention(tiny("naive", max_seconds=None), clock=lambda: clock["now"])
    assert record.forward_samples_ms == pytest.approx([5000.0] * 3)
    assert record.backward_samples_ms == pytest.approx([1.0] * 3)


def _advancing_backward(backward, clock):
    def fake(self, *args, **kwargs):
        clock["now"] += 1e-3
        return backward(self, *args, **kwargs)

    return fake


def test_out_of_memory_is_a_row_and_memory_is_released():
    """A real CPU out-of-memory: a 128 MiB score matrix under a 96 MiB address-space allowance."""
    big = tiny("naive", context_length=4096, head_dim=16, batch_size=2, warmup_steps=0, measure_steps=1)
    with soft_address_space_cap(96 * 2**20):
        record = run_attention(big, memory_limit_bytes=96 * 2**20)
        after = run_attention(tiny("naive"))  # the sweep goes on
    assert record.status == "oom", record.error
    assert record.error.startswith("forward: ") and "can't allocate memory" in record.error
    assert record.forward_mean_ms is None and record.memory_limit_bytes == 96 * 2**20
    assert after.status == "ok"


def test_an_oom_in_backward_keeps_the_forward_measurements(monkeypatch):
    def failing_backward(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(torch.Tensor, "backward", failing_backward)
    record = run_attention(tiny("naive"))
    assert record.status == "oom" and record.error == "backward: CUDA out of memory. Tried to allocate 8.00 GiB"
    assert record.memory_before_backward_bytes is not None  # measured before the backward that failed


def test_other_failures_are_error_rows(monkeypatch):
    def broken(q, k, v):
        raise ValueError("shapes do not match")

    monkeypatch.setattr(attention_bench.measure, "attention_for", lambda config, adapters=None: broken)
    record = run_attention(tiny("naive"))
    assert record.status == "error" and record.error == "forward: ValueError: shapes do not match"


def test_unsupported_precision_is_a_row():
    record = run_attention(tiny("naive", precision="tf32"))
    assert record.status == "unsupported" and "TF32" in record.error


def test_time_budget_cuts_steps_and_says_so():
    record = run_attention(tiny("naive", measure_steps=50, warmup_steps=0, max_seconds=1e-9))
    assert record.status == "ok" and record.forward_steps == 3 and record.backward_steps == 3
    assert "forward: 3 of 50 steps" in record.notes and "backward: 3 of 50 steps" in record.notes


def test_compiled_reports_compile_time_apart():
    if compile_unsupported_reason(torch.device("cpu")):
        pytest.skip("torch.compile unavailable here")
    record = run_attention(tiny("compiled", measure_steps=2))
    assert record.status == "ok", record.error
    assert record.compile_s > 0 and record.compile_s * 1e3 > 5 * record.forward_max_ms
    assert record.saved_for_backward_bytes > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--head-dims", "0"], "must be a positive integer"),
        (["--seq-lens", "x"], "expected an integer"),
        (["--implementations", "flash"], "invalid choice"),
        (["--precision", "fp8"], "invalid choice"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--device", "cpu", "--timer", "cuda-event"], "cuda-event needs a CUDA device"),
        (["--device", "cpu", "--memory-limit", "lots"], "--memory-limit: not a size"),
        (["--device", "cpu", "--max-seconds", "-1"], "--max-seconds: must be zero or more"),
        (["--device", "cpu", "--output", "r.xlsx"], "unknown suffix"),
        (["--device", "cpu", "--plot", "r.txt"], "use a .png, .svg or .pdf file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    try:
        code = attention_bench.main(args)
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err
    assert err.startswith(f"{PROG}: error:")


def test_cli_writes_every_format_and_a_plot(tmp_path, capsys, saved_figures):
    outputs = [tmp_path / "a.csv", tmp_path / "a.md", tmp_path / "a.jsonl"]
    args = ["--device", "cpu", "--head-dims", "8", "16", "--seq-lens", "16", "32", "--batch-size", "2"]
    args += ["--steps", "2", "--warmup-steps", "0", "--implementations", "naive", "sdpa"]
    code = attention_bench.main(args + sum((["--output", str(p)] for p in outputs), []))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("# Attention forward and backward") and "memory_before_backward_mib" in out
    frame = pd.read_csv(outputs[0])
    assert len(frame) == 8 and set(frame["status"]) == {"ok"}
    assert list(frame.columns[:4]) == ["tool", "implementation", "head_dim", "context_length"]
    assert set(frame["tool"]) == {"attention_bench"}
    lines = [json.loads(line) for line in outputs[2].read_text().splitlines()]
    assert len(lines[0]["forward_samples_ms"]) == 2 and len(lines[0]["backward_samples_ms"]) == 2
    # the plot: a panel per (pass, head dim), a line per implementation through its rows' means
    (figure,) = saved_figures
    assert (tmp_path / "a.png").exists()
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == [f"{p}, head_dim {d}" for p in ("forward", "backward", "end_to_end") for d in (8, 16)]
    forward_d8 = {line.get_label(): list(line.get_ydata()) for line in figure.axes[0].get_lines()}
    for implementation in ("naive", "sdpa"):
        expected = frame[(frame["implementation"] == implementation) & (frame["head_dim"] == 8)]
        assert forward_d8[implementation] == pytest.approx(
            list(expected.sort_values("context_length")["forward_mean_ms"])
        )
    assert "wrote" in err and "naive fp32 head_dim=8 context_length=16: forward" in err
    # how busy the machine was over the 8 rows, in one line, as benchmark and the sweeps end
    assert re.search(r"^(The machine was quiet while the 8 rows|Other processes kept up to .* of 8 rows)", err, re.M)


def test_plot_marks_oom_points(tmp_path):
    rows = [
        dict(
            implementation=i,
            head_dim=d,
            context_length=t,
            batch_size=8,
            precision="fp32",
            status="ok",
            forward_mean_ms=t / 100,
            backward_mean_ms=t / 50,
            device_name="cpu",
        )
        for i in ("naive", "sdpa")
        for d in (16, 64)
        for t in (256, 1024)
    ]
    rows.append(dict(rows[0], context_length=4096, status="oom", forward_mean_ms=math.nan, backward_mean_ms=math.nan))
    path = attention_bench.plot(rows, tmp_path / "p.png")
    assert path.stat().st_size > 10_000
    figure = attention_bench.draw(rows)
    panels = {ax.get_title(): ax for ax in figure.axes}
    for name in ("forward", "backward"):
        # the OOM of naive at head dim 16 is one x at its sequence length, on the top edge of that panel only
        [marker] = [line for line in panels[f"{name}, head_dim 16"].get_lines() if line.get_label() == "naive OOM"]
        assert marker.get_marker() == "x" and list(marker.get_xdata()) == [4096]
        assert list(marker.get_ydata()) == [0.95] and marker.get_color() == "tab:red"
        measured = [line for line in panels[f"{name}, head_dim 16"].get_lines() if line.get_label() == "naive"]
        assert list(measured[0].get_xdata()) == [256, 1024]  # no point drawn where nothing was measured
        assert not any("OOM" in line.get_label() for line in panels[f"{name}, head_dim 64"].get_lines())
    assert "naive OOM" in [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def test_module_entry_point_in_a_child_process():
    result = subprocess.run(
        [PYTHON, "-m", "cs336_systems.attention_bench", "--head-dims", "-4"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith(f"{PROG}: error: argument --head-dims: must be a positive integer")


def test_old_and_singular_spellings_are_aliases():
    parse = attention_bench.build_parser().parse_args
    new = parse(
        ["--context-lengths", "16", "32", "--measure-steps", "2", "--head-dims", "8", "--implementations", "sdpa"]
    )
    old = parse(["--seq-lens", "16", "32", "--steps", "2", "--head-dim", "8", "--implementation", "sdpa"])
    assert vars(new) == vars(old)
    assert (new.context_lengths, new.measure_steps, new.head_dims, new.implementations) == ([16, 32], 2, [8], ["sdpa"])
    defaults = parse([])
    assert defaults.context_lengths == [256, 1024, 4096, 8192, 16384] and defaults.measure_steps == 100
    help_text = attention_bench.build_parser().format_help()
    assert "--context-lengths" in help_text and "--seq-lens" not in help_text  # aliases work, unadvertised


def test_ctrl_c_keeps_the_finished_rows_and_exits_130(tmp_path, capsys, monkeypatch):
    real, calls = attention_run.run_attention, []

    def interrupted_second(config, **kwargs):
        calls.append(config)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(config, **kwargs)

    monkeypatch.setattr(attention_run, "run_attention", interrupted_second)
    csv = tmp_path / "a.csv"
    code = attention_bench.main(
        [
            "--device",
            "cpu",
            "--head-dims",
            "8",
            "--context-lengths",
            "16",
            "32",
            "--measure-steps",
            "2",
            "--implementations",
            "naive",
            "--output",
            str(csv),
        ]
    )
    _, err = capsys.readouterr()
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert list(pd.read_csv(csv)["context_length"]) == [16]


def test_ctrl_c_without_an_output_prints_the_finished_rows(capsys, monkeypatch):
    real, calls = attention_run.run_attention, []

    def interrupted_second(config, **kwargs):
        calls.append(config)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(config, **kwargs)

    monkeypatch.setattr(attention_run, "run_attention", interrupted_second)
    flags = ["--device", "cpu", "--head-dims", "8", "--context-lengths", "16", "32", "--measure-steps", "2"]
    code = attention_bench.main([*flags, "--implementations", "naive"])
    out, err = capsys.readouterr()
    table = [line for line in out.splitlines() if line.startswith("| naive")]
    assert code == 130 and len(table) == 1 and "| 16 " in table[0]
    assert err.strip().splitlines()[-1].endswith("the rows finished so far are printed above (no --output)")


@pytest.mark.parametrize(("status", "code"), [("oom", 0), ("unsupported", 0), ("error", 1)])
def test_exit_status_follows_the_rows(status, code, tmp_path, capsys, monkeypatch):
    def fixed(config, **kwargs):
        record = run_attention(tiny("naive", precision="tf32"))  # unsupported on a CPU: no work done
        record.status = status
        return record

    monkeypatch.setattr(attention_run, "run_attention", fixed)
    assert attention_bench.main(["--device", "cpu", "--head-dims", "8", "--context-lengths", "16"]) == code


def test_every_attention_setting_is_an_identity_column_of_its_record():
    import dataclasses

    from cs336_systems.attention_bench.config import AttentionConfig
    from cs336_systems.attention_bench.record import AttentionRecord, new_record

    assert [f.name for f in dataclasses.fields(AttentionConfig)] == list(AttentionRecord.identity_fields())
    config = tiny("sdpa", context_length=64)
    row = new_record(config, torch.device("cpu"), None).to_row()
    assert {name: row[name] for name in AttentionRecord.identity_fields()} == dataclasses.asdict(config)


def test_a_mistyped_flag_is_told_before_torch_is_imported():
    """Importing torch takes seconds (tens on a busy machine): the flags are read first."""
    code = (
        "import sys\n"
        "from cs336_systems.attention_bench import cli\n"
        "try:\n"
        "    cli.main(['--contxt-lengths', '8'])\n"
        "except SystemExit as exc:\n"
        "    sys.exit(exc.code + (10 if 'torch' not in sys.modules else 0))\n"
    )
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert result.returncode == 12 and "unrecognized arguments: --contxt-lengths" in result.stderr
