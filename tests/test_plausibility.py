"""What a value can be, declared once (results/plausibility.py): each rule with a row that breaks it,
kept raw in the files, said in the row's notes, and shown as n/m with its reason in a report's table."""

from __future__ import annotations

import pandas as pd
import pytest

from cs336_systems.report.grid import Value, grid
from cs336_systems.results import plausibility
from cs336_systems.results.plausibility import NOT_MEASURABLE

EXPOSED = "step - no_sync step (exposed)"


@pytest.mark.parametrize(
    "row, field, words",
    [
        ({"mfu": 2.0}, "mfu", "not a share of the peak"),
        ({"mfu": -0.1}, "mfu", "not a share of the peak"),
        ({"median_ms": -3.0}, "median_ms", "below zero"),
        ({"peak_optimizer_bytes": -139460.0}, "peak_optimizer_bytes", "peak optimizer -136.19 KiB is below zero"),
        (  # the RSS high-water mark above a 400 MB baseline saw 0.0195 MiB while the rank held 1.26 MiB
            {"peak_model_bytes": 20480, "param_bytes_per_rank": 1321206},
            "peak_model_bytes",
            "the peak after building, 20.00 KiB, is below the 1.26 MiB the rank holds (parameters)",
        ),
        (
            {"peak_before_optimizer_bytes": 2548039, "param_bytes_per_rank": 1316044, "grad_bytes_per_rank": 1316044},
            "peak_before_optimizer_bytes",
            "is below the 2.51 MiB the rank holds (parameters + gradients)",
        ),
        (
            {
                "peak_optimizer_bytes": 4 * 2**20,
                "param_bytes_per_rank": 2**20,
                "grad_bytes_per_rank": 2**20,
                "optimizer_state_bytes_per_rank": 2 * 2**20 + 1,
            },
            "peak_optimizer_bytes",
            "below the 4.00 MiB the rank holds (parameters + gradients + optimizer state)",
        ),
        (  # an attention row: the means of outlier-laden samples put end-to-end below forward
            {
                "end_to_end_mean_ms": 0.760,
                "forward_mean_ms": 0.782,
                "end_to_end_median_ms": 2.0,
                "forward_median_ms": 0.7,
            },
            "end_to_end_mean_ms",
            "end-to-end 0.76 ms is below the forward's 0.782 ms (means, separate loops)",
        ),
        ({"end_to_end_p10_ms": 1.0, "backward_p10_ms": 1.5}, "end_to_end_p10_ms", "below the backward's 1.5 ms"),
        ({"comm_pct": 120.0}, "comm_pct", "not a share"),
        ({"scaling_efficiency": 1.10}, "scaling_efficiency", "faster than one process alone"),
        (
            {"comm_ms": -13.2, "comm_method": EXPOSED, "comm_step_ms": [-31.2, -13.2, 75.9]},
            "comm_ms",
            "per-step differences -31.2..+75.9 ms straddle 0",
        ),
        ({"comm_ms": 8.0, "comm_method": EXPOSED, "comm_step_ms": [-2.0, 9.0, 8.0, 20.0]}, "comm_ms", "straddle 0"),
    ],
)
def test_each_rule_names_the_field_and_why(row, field, words):
    found = plausibility.problems(row)
    assert field in found and words in found[field]


def test_plausible_values_pass_and_a_share_depends_on_its_source():
    assert plausibility.problems({"mfu": 0.53, "median_ms": 649.6, "comm_pct": 40.0, "scaling_efficiency": 0.95}) == {}
    held = {"param_bytes_per_rank": 100, "grad_bytes_per_rank": 100, "optimizer_state_bytes_per_rank": 200}
    peaks = {"peak_model_bytes": 100, "peak_before_optimizer_bytes": 200, "peak_optimizer_bytes": 400}
    assert plausibility.problems({**held, **peaks}) == {}  # exactly what is held: possible
    assert plausibility.problems(peaks) == {}  # nothing to hold it against
    timed = {"end_to_end_median_ms": 3.0, "forward_median_ms": 1.0, "backward_median_ms": 2.0, "end_to_end_tflops": 1}
    assert plausibility.problems(timed) == {}
    below = plausibility.problems({**timed, "end_to_end_median_ms": 1.9})  # below backward alone
    assert set(below) == {"end_to_end_median_ms", "end_to_end_tflops"}  # its rate is on that median
    resolved = {"comm_ms": 10.0, "comm_method": EXPOSED, "comm_step_ms": [9.0, 10.0, 11.0, 10.5, 9.5]}
    assert plausibility.problems(resolved) == {}
    timed = {"comm_ms": 10.9, "comm_method": "all-gather + reduce-scatter time", "comm_step_ms": [10.9]}
    assert plausibility.problems(timed) == {}  # one profiled step measured directly, not a difference
    broken = {"comm_ms": -1.0, "comm_pct": -8.0, "comm_method": EXPOSED, "comm_step_ms": [-5.0, 1.0, 3.0]}
    assert set(plausibility.problems(broken)) == {"comm_ms", "comm_pct"}


def test_the_row_keeps_its_raw_value_and_says_why_in_its_notes(tmp_path):
    from cs336_systems.results import read_results
    from cs336_systems.results.files import ResultSink
    from cs336_systems.results.records import BenchmarkRecord
    from tests.helpers import tiny_benchmark_config

    record = BenchmarkRecord.for_config(tiny_benchmark_config(), __import__("torch").device("cpu"), None, 10)
    record.mfu, record.notes = 2.5, "a note of its own"
    path, page = tmp_path / "rows.csv", tmp_path / "rows.md"
    with ResultSink([path, page], BenchmarkRecord) as sink:
        sink.write(record)
    row = read_results(path).iloc[0]
    assert row["mfu"] == 2.5  # raw in the file
    assert row["notes"].startswith("a note of its own; not measurable: MFU 2.5 is not a share of the peak")
    text = page.read_text()
    assert "2.500" not in text and f"| {NOT_MEASURABLE} " in text  # the tool's own table
    assert "not measurable: MFU 2.5" in text  # the reason under it
    shown = read_results(page).iloc[0]
    assert pd.isna(shown["mfu"]) and shown["batch_size"] == row["batch_size"]  # n/m reads back as missing


def test_a_table_shows_n_m_and_the_reason_never_the_impossible_number():
    frame = pd.DataFrame(
        [
            {
                "tool": "ddp_bench",
                "strategy": "ddp",
                "world_size": 2,
                "status": "ok",
                "median_ms": 40.0,
                "scaling_efficiency": 1.1,
            },
            {
                "tool": "ddp_bench",
                "strategy": "flat",
                "world_size": 2,
                "status": "ok",
                "median_ms": 50.0,
                "scaling_efficiency": 0.8,
            },
        ]
    ).assign(source="rows.csv")
    table = grid(
        frame,
        "ddp_bench",
        title="t",
        labels=[("strategy", "strategy")],
        values=[Value("efficiency (%)", "scaling_efficiency", "x100")],
    )
    cells = table.frame["efficiency (%)"].tolist()
    assert cells[0] == NOT_MEASURABLE and cells[1] != NOT_MEASURABLE
    assert any(note.startswith(f"{NOT_MEASURABLE}: ddp: scaling efficiency 110%") for note in table.footnotes)


def test_a_share_computed_from_an_unusable_value_is_explained_once_under_the_table():
    row = {"tool": "ddp_bench", "strategy": "zero1", "world_size": 2, "status": "ok", "median_ms": 25.0}
    row |= {"comm_ms": -1.0, "comm_pct": -4.0, "comm_method": EXPOSED, "comm_step_ms": [-12.1, -1.0, 5.3]}
    table = grid(
        pd.DataFrame([row]).assign(source="rows.csv"),
        "ddp_bench",
        title="t",
        labels=[("strategy", "strategy")],
        values=[Value("communication (ms)", "comm_ms", "sig3"), Value("communication (%)", "comm_pct", "sig3")],
    )
    assert table.frame.iloc[0].tolist() == [NOT_MEASURABLE, NOT_MEASURABLE]
    notes = [note for note in table.footnotes if note.startswith(NOT_MEASURABLE)]
    assert notes == [f"{NOT_MEASURABLE}: zero1: exposed communication: per-step differences -12.1..+5.3 ms straddle 0."]


def test_a_failed_rows_note_names_it_by_the_fewest_labels_that_tell_the_rows_apart():
    base = {"tool": "attention_bench", "implementation": "flash-pytorch", "head_dim": 16, "status": "ok"}
    rows = [
        {**base, "context_length": n, "precision": p, "forward_mean_ms": 1.0}
        for n in (64, 128)
        for p in ("bf16", "fp32")
    ]
    for row in rows:
        if row["precision"] == "bf16":
            row.update(status="error", error="forward: RuntimeError: dtypes differ", forward_mean_ms=None)
    table = grid(
        pd.DataFrame(rows).assign(source="rows.csv"),
        "attention_bench",
        title="t",
        labels=[("implementation", "implementation"), ("d", "head_dim"), ("seq", "context_length"), ("p", "precision")],
        values=[Value("forward (ms)", "forward_mean_ms", "sig3")],
    )
    assert (
        "flash-pytorch d 16 seq 64 bf16; flash-pytorch d 16 seq 128 bf16: error: forward: RuntimeError: dtypes differ."
        in table.footnotes
    )


def test_a_table_that_shows_a_rate_beside_times_shows_the_statistic_the_rate_is_on():
    # the all-reduce's bus bandwidth is on the median step: beside a table of means it is not checkable
    row = {"tool": "allreduce_bench", "world_size": 2, "size": "1MB", "status": "ok"}
    frame = pd.DataFrame([{**row, "mean_ms": 2.0, "median_ms": 1.0, "busbw_gbps": 1.0}]).assign(source="rows.csv")
    labels = [("ranks", "world_size")]
    with pytest.raises(ValueError, match="shows a rate beside mean times"):
        grid(
            frame,
            "allreduce_bench",
            title="t",
            labels=labels,
            values=[Value("t", "mean_ms", "ms±"), Value("bw", "busbw_gbps", "sig3")],
        )
    grid(
        frame,
        "allreduce_bench",
        title="t",
        labels=labels,
        values=[Value("t", "median_ms", "ms"), Value("bw", "busbw_gbps", "sig3")],
    )
    from cs336_systems.report.distributed import allreduce_tables

    time, bandwidth = allreduce_tables(frame.assign(size_bytes=2**20))
    assert time.spec.values[0].field == "median_ms" and bandwidth.spec.values[0].field == "busbw_gbps"
