import numpy as np
import pandas as pd
import pytest

from cs336_systems import compare
from cs336_systems.report import cli as report
from cs336_systems.results import ResultSink
from cs336_systems.runner import run_benchmark
from tests.helpers import tiny_benchmark_config


@pytest.fixture(scope="module")
def results_csv(tmp_path_factory):
    """Real tiny rows: fp32 and bf16, two contexts, plus one OOM."""
    path = tmp_path_factory.mktemp("results") / "sweep.csv"
    sink = ResultSink([path])
    for precision in ("fp32", "bf16"):
        for context in (8, 16):
            sink.write(
                run_benchmark(
                    tiny_benchmark_config(
                        precision=precision, context_length=context, pass_type="forward", peak_tflops=1.0
                    )
                )
            )
    oom = run_benchmark(tiny_benchmark_config(context_length=16, pass_type="forward-backward", peak_tflops=1.0))
    oom.status, oom.error, oom.mean_ms = "oom", "CUDA out of memory. Tried to allocate 2.00 GiB", None
    sink.write(oom)
    return path


def test_report_tables_speedups_and_plots(results_csv, tmp_path, capsys):
    output = tmp_path / "writeup" / "report.md"
    assert report.main([str(results_csv), "--output", str(output)]) == 0
    text = output.read_text()
    assert "## Environment" in text and "2.13" in text
    assert (
        "#### forward step time" in text
        and "| custom d32 L2 ff64 V97 | fp32 " in text
        and "| custom d32 L2 ff64 V97 | bf16 " in text
    )
    assert "±" in text and "ctx 8" in text and "ctx 16" in text
    assert "#### forward-backward step time" in text and "OOM" in text and "OOM: out of memory" in text
    assert "#### bf16 against fp32" in text and "speedup" in text
    plots = sorted(output.parent.glob("report_*.png"))
    assert plots and all(p.stat().st_size > 1000 and f"]({p.name})" in text for p in plots)
    assert report.main(["--verify", str(output), str(results_csv)]) == 0


def test_a_plot_labels_contexts_as_measured_and_draws_the_tables_spread(results_csv, tmp_path, saved_figures):
    """The step-time figure's x axis reads 8 and 16 (not 8.0), its lines are named by model as the tables
    name them, and each point's ± std, as the table shows it, is an error bar as long as the row's std_ms."""
    assert report.main([str(results_csv), "--output", str(tmp_path / "report.md")]) == 0
    figure = next(f for f in saved_figures if f.axes[0].get_xlabel() == "context length")
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["8", "16"]
    # a line per model and precision, named as the table names them
    assert [text.get_text() for text in ax.get_legend().get_texts()] == [
        f"custom d32 L2 ff64 V97, {p}" for p in ("fp32", "bf16")
    ]
    rows = pd.read_csv(results_csv).query("status == 'ok' and pass_type == 'forward'")
    bars = next(c for c in ax.containers if c.has_yerr)  # the first series' (fp32's) ErrorbarContainer
    segments = np.array(bars.lines[2][0].get_segments())  # a bar per point: (x, y - std) to (x, y + std)
    half = (segments[:, 1, 1] - segments[:, 0, 1]) / 2
    assert sorted(half) == pytest.approx(sorted(rows.query("precision == 'fp32'")["std_ms"]), rel=1e-6)


def test_report_with_one_precision_two_custom_models_and_compile(results_csv, tmp_path):
    rows = pd.read_csv(results_csv)
    fp32 = rows[(rows["precision"] == "fp32") & (rows["status"] == "ok")]
    wider = fp32.assign(d_model=64, num_params=fp32["num_params"] * 3, mean_ms=fp32["mean_ms"] * 2)
    compiled = fp32.assign(compile=True, mean_ms=fp32["mean_ms"] / 4, cv_pct=50.0, mfu=1.5, peak_source="measured")
    path = tmp_path / "one_precision.csv"
    pd.concat([fp32, wider, compiled]).to_csv(path, index=False)
    output = tmp_path / "report.md"
    assert report.main([str(path), "--output", str(output), "--note", "Measured on a shared VM."]) == 0
    text = output.read_text()
    assert text.startswith("# Benchmark report\n\nMeasured on a shared VM.\n")
    assert "bf16" not in text  # nothing to compare against
    assert "| custom d32 L2 ff64 V97 |" in text and "| custom d64 L2 ff64 V97 |" in text  # two rows, not one
    assert "#### compiled against eager" in text and "| eager (ms) " in text
    assert report.main(["--verify", str(output), str(path)]) == 0


def test_report_errors(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert report.main([str(tmp_path / "x.csv")]) == 2
    assert report.main([str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err
    assert "not the output of any tool of this project" in err and "no such file" in err


def test_compare_exits_1_on_a_planted_regression(results_csv, tmp_path, capsys):
    new = pd.read_csv(results_csv)
    new.loc[1, "median_ms"] *= 1.5  # fp32 forward at context 16 got 50% slower
    new = new.drop(index=3)  # bf16 context 16 missing in the new run
    new_path = tmp_path / "new.csv"
    new.to_csv(new_path, index=False)

    assert compare.main([str(results_csv), str(new_path), "--fail-above", "10"]) == 1
    out = capsys.readouterr().out
    assert "SLOWER by 50.0% (> 10%)" in out and "1.500" in out
    assert "Only in base (1, not compared)" in out and "precision=bf16" in out
    assert "4 matched, 1 regression(s) beyond 10%." in out
    assert "- base: 5 rows; device_name " in out and "torch_version " in out  # measured alike?
    assert compare.main([str(results_csv), str(new_path), "--fail-above", "60"]) == 0
    assert compare.main([str(results_csv), str(results_csv), "--fail-above", "1"]) == 0


def test_compare_counts_a_new_failure_as_regression(results_csv, tmp_path, capsys):
    new = pd.read_csv(results_csv)
    new.loc[0, "status"] = "oom"
    path = tmp_path / "new.csv"
    new.to_csv(path, index=False)
    assert compare.main([str(results_csv), str(path), "--fail-above", "10"]) == 1
    assert "REGRESSION: now oom" in capsys.readouterr().out


def test_compare_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n1\n")
    assert compare.main([str(bad), str(bad)]) == 2
    assert "not a benchmark result file" in capsys.readouterr().err


def test_rows_of_one_configuration_from_two_gpus_stay_apart_and_the_report_says_so(results_csv, tmp_path):
    """A Slurm sweep whose jobs landed on two kinds of GPU: one cell per device, never one merged cell,
    and the environment table names both."""
    rows = pd.read_csv(results_csv)
    fp32 = rows[(rows["precision"] == "fp32") & (rows["status"] == "ok")].head(1)
    fp32 = fp32.assign(device_name="NVIDIA H100 80GB HBM3", mean_ms=2.5)  # the test's names, not this machine's
    other = fp32.assign(device_name="NVIDIA A100-SXM4-80GB", mean_ms=7.5)
    merged = tmp_path / "two_gpus.csv"
    pd.concat([fp32, other]).to_csv(merged, index=False)
    output = tmp_path / "report.md"
    assert report.main([str(merged), "--output", str(output)]) == 0
    text = output.read_text()
    device_row = next(line for line in text.splitlines() if line.startswith("| device "))  # the environment table
    assert [cell.strip() for cell in device_row.split("|")[2:-1]] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    for name, rows in (("NVIDIA H100 80GB HBM3", fp32), ("NVIDIA A100-SXM4-80GB", other)):  # a table per device
        table = text.split(f"#### forward step time, {name} (ms)")[1].split("####")[0]
        assert f"| {float(rows['mean_ms'].iloc[0]):.2f} ±" in table
