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
    oom.status, oom.error, oom.mean_ms, oom.median_ms = (
        "oom",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        None,
        None,
    )
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
    assert "Median (interquartile range)" in text and "ctx 8" in text and "ctx 16" in text
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


def _quiet(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows measured on a quiet machine with steps alike (IQR 1% of the median), whatever this one is."""
    return rows.assign(other_load_cores=0.0, gpu_other_processes=None, iqr_ms=rows["median_ms"] * 0.01)


def test_compare_exits_1_on_a_planted_regression(results_csv, tmp_path, capsys):
    base = _quiet(pd.read_csv(results_csv))
    base_path = tmp_path / "base.csv"
    base.to_csv(base_path, index=False)
    new = base.copy()
    new.loc[1, "median_ms"] *= 1.5  # fp32 forward at context 16 got 50% slower
    new = new.drop(index=3)  # bf16 context 16 missing in the new run
    new_path = tmp_path / "new.csv"
    new.to_csv(new_path, index=False)
    results_csv = base_path

    assert compare.main([str(results_csv), str(new_path), "--fail-above", "10"]) == 1
    out = capsys.readouterr().out
    assert "SLOWER by 50.0% (> 10%)" in out and "1.500" in out
    assert "Only in base (1, not compared)" in out and "precision=bf16" in out
    assert "4 matched, 1 regression(s) beyond 10%." in out
    assert "- base: 5 rows; device_name " in out and "torch_version " in out  # measured alike?
    assert compare.main([str(results_csv), str(new_path), "--fail-above", "60"]) == 0
    assert compare.main([str(results_csv), str(results_csv), "--fail-above", "1"]) == 0


def test_compare_ranks_no_busy_rows_and_says_when_thread_counts_differ(results_csv, tmp_path, capsys):
    """The issue's 'faster by 96.2%' of a busy 2-thread run against a 1-thread one: withheld, saying why;
    on a quiet machine the same difference is a verdict that names the thread counts."""
    base = _quiet(pd.read_csv(results_csv)).assign(num_threads=1)
    new = base.assign(num_threads=2, median_ms=base["median_ms"] * 0.04)
    paths = [tmp_path / "base.csv", tmp_path / "quiet.csv", tmp_path / "busy.csv"]
    for path, rows in zip(paths, (base, new, new.assign(other_load_cores=1.2))):
        rows.to_csv(path, index=False)
    assert compare.main([str(paths[0]), str(paths[2]), "--fail-above", "10"]) == 0
    out = capsys.readouterr().out
    assert "faster" not in out and "SLOWER" not in out and ", 4 not compared." in out
    assert "not compared (other processes kept up to 1.2 cores busy while these rows were measured)" in out
    assert (
        "- new: 5 rows;" in out and "Other processes kept up to 1.2 cores busy (the rows' torch used 2 threads)" in out
    )
    assert compare.main([str(paths[0]), str(paths[1])]) == 0
    assert "faster by 96.0% (measured with 2 and 1 threads)" in capsys.readouterr().out


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
    fp32 = fp32.assign(device_name="NVIDIA H100 80GB HBM3", median_ms=2.5, iqr_ms=0.1)  # the test's names
    other = fp32.assign(device_name="NVIDIA A100-SXM4-80GB", median_ms=7.5)
    merged = tmp_path / "two_gpus.csv"
    pd.concat([fp32, other]).to_csv(merged, index=False)
    output = tmp_path / "report.md"
    assert report.main([str(merged), "--output", str(output)]) == 0
    text = output.read_text()
    device_row = next(line for line in text.splitlines() if line.startswith("| device "))  # the environment table
    assert [cell.strip() for cell in device_row.split("|")[2:-1]] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    for name, rows in (("NVIDIA H100 80GB HBM3", fp32), ("NVIDIA A100-SXM4-80GB", other)):  # a table per device
        table = text.split(f"#### forward step time, {name} (ms)")[1].split("####")[0]
        assert f"| {float(rows['median_ms'].iloc[0]):.2f} (0.100)" in table


def test_report_on_a_busy_sweep_says_the_load_and_compares_no_busy_rows(tmp_path):
    """The issue's '2.02x the FLOPs from context 64 to 128 take 0.79x the time' from rows measured while
    other processes kept 1.05-1.39 cores busy: the report says the load and draws no floor from them."""
    from tests.test_report_formats import _row

    def rows(load):
        return [
            _row(
                pass_type="forward", context_length=n, flops_per_step=f, median_ms=t, iqr_ms=0.01, other_load_cores=load
            )
            for n, f, t in ((64, 1.0e9, 10.0), (128, 2.02e9, 7.9))
        ]

    made = {}
    for name, load in (("busy", 1.39), ("quiet", 0.0)):
        path = tmp_path / f"{name}.csv"
        pd.DataFrame(rows(load)).to_csv(path, index=False)
        output = tmp_path / f"{name}.md"
        assert report.main([str(path), "--output", str(output)]) == 0
        assert report.main(["--verify", str(output), str(path)]) == 0
        made[name] = output.read_text()
    assert "Other processes kept up to 1.4 cores busy, during 2 of 2 rows: those times are inflated" in made["busy"]
    assert "FLOPs" not in made["busy"]
    assert "The machine was quiet while the 2 rows were measured" in made["quiet"]
    assert (
        "custom d32 L2 ff64 V97, fp32: 2.02x the FLOPs; context 128 against context 64: 0.79x the time "
        "(interval 0.79x to 0.79x): a floor the arithmetic does not set." in made["quiet"]
    )
