"""The write-up of a handout plan: every problem of the edition in the handout's order, the bytes
each rank holds, a reason and a command for what was not measured, and observations that are
the numbers of the rows (checked against hand-computed values)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from cs336_systems.handout.problems import EDITIONS
from cs336_systems.handout.problems.attention import attention_observations
from cs336_systems.handout.problems.benchmarking import timing_observations, warmup_observations
from cs336_systems.handout.problems.checkpointing import checkpoint_observations
from cs336_systems.handout.problems.data_parallel import ddp_observations, gather_observations, held_observations
from cs336_systems.handout.problems.precision import precision_observations
from cs336_systems.report.verify import parse_tables
from cs336_systems.results.readers import as_todays_rows
from tests.helpers import REPO

WRITEUP = REPO / "writeup" / "2026"


@pytest.fixture(scope="module")
def text() -> str:
    return (WRITEUP / "writeup.md").read_text()


def _section(text: str, label: str) -> str:
    start = text.index(f"\n## {label}:")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_every_problem_of_the_edition_is_a_section_in_the_handouts_order(text):
    headings = re.findall(r"^## ([a-z0-9_]+): ", text, re.M)
    assert headings == list(EDITIONS["2026"])
    assert text.index("## What was measured, where") < text.index("## benchmarking_script:")


def test_the_sharding_and_fsdp_sections_show_the_bytes_each_rank_holds(text):
    for label in ("optimizer_state_sharding_accounting", "fsdp_accounting"):
        held = next(t for t in parse_tables(_section(text, label)) if t.title == "Bytes each rank holds after a step")
        assert any(h.startswith("parameters (") for h in held.header) and any(
            h.startswith("optimizer state (") for h in held.header
        )
        by_strategy = {row[0]: row for row in held.rows}
        assert {"single", "ddp" if label.startswith("optimizer") else "fsdp2"} <= set(by_strategy), by_strategy
    zero = next(
        t for t in parse_tables(_section(text, "optimizer_state_sharding_accounting")) if t.title.startswith("Bytes")
    )
    column = next(i for i, h in enumerate(zero.header) if h.startswith("optimizer state"))
    state = {row[0]: float(row[column]) for row in zero.rows if row[column][:1].isdigit()}
    assert state["zero1"] < state["ddp"]  # ZeRO-1 keeps its shard of the AdamW moments


def test_every_communication_time_says_how_it_was_measured(text):
    """One quantity per column: each data-parallel row with a communication time says in words how it was
    measured (a loop timed, a difference of two timings, a profiled step)."""
    tables = [t for t in parse_tables(text) if t.title == "Time per training step"]
    assert tables
    for table in tables:
        time, how = table.header.index("communication (ms)"), table.header.index("communication measured as")
        for row in table.rows:
            assert (row[time] == "") == (row[how] == ""), row


def test_a_part_not_measured_here_says_why_and_how_to_measure_it(text):
    memory = _section(text, "memory_profiling")
    lines = [line for line in memory.splitlines() if "not measured here" in line]
    assert lines and all(
        "needs a GPU" in line
        and line.endswith("To measure it on a GPU: `cs336-bench handout --edition 2026 --problems memory_profiling`.")
        for line in lines
    ), lines
    nsys = _section(text, "nsys_profile")
    assert "torch profiler, not nsys" in nsys and "Longest operators" in nsys  # labelled as what it is


def test_the_first_page_checklist_is_the_plans_outcomes(text):
    checklist = next(t for t in parse_tables(text) if t.title == "Every problem of the edition")
    status = {row[0]: row[1] for row in checklist.rows}
    assert list(status) == list(EDITIONS["2026"])
    plan = pd.read_csv(WRITEUP / "handout_plan.csv")
    for problem, steps in plan.groupby("problem"):
        if (steps["outcome"] == "skipped").all():
            assert status.get(problem, status.get("fsdp_accounting")) == "not measured", problem
    assert status["flash_forward"] == "code" and status["tp_calcs"] == "derivation"


def test_the_benchmarking_observations_are_the_rows_numbers(text):
    """The table shows means (the handout asks for mean and std): so does the sentence under it."""
    rows = as_todays_rows(pd.read_json(WRITEUP / "benchmarking_script-b-small.jsonl", lines=True))
    step = rows[rows["pass_type"] == "train-step"].iloc[0]
    ratio = step["backward_mean_ms"] / step["forward_mean_ms"]
    said = f"The backward pass (train-step rows) against the forward pass: {ratio:.2f}x the time (interval "
    assert said in _section(text, "benchmarking_script")


def _bench(model="m", **values) -> dict:
    return {"model": model, "status": "ok", "num_params": 100, **values}


def test_timing_observations_by_hand():
    """Each ratio is a claim on the means the table shows: steps alike give a point interval."""
    rows = [
        _bench("small", pass_type="forward", mean_ms=10.0, num_params=100, cv_pct=2.0, step_ms=[10.0, 10.1, 9.9]),
        _bench("large", pass_type="forward", mean_ms=40.0, num_params=400, cv_pct=12.0, step_ms=[40.0, 41.0, 39.0]),
    ]
    for model, forward, backward, optimizer in (("small", 10.0, 20.0, 3.0), ("large", 40.0, 100.0, 6.0)):
        phases = {"forward_samples_ms": [forward] * 3, "backward_samples_ms": [backward] * 3}
        step = {"optimizer_samples_ms": [optimizer] * 3, "step_ms": [forward + backward + optimizer] * 3}
        rows.append(_bench(model, pass_type="train-step", cv_pct=1.0, **phases, **step))
    lines = timing_observations(rows)
    # the bootstrap's means lie between 39/10.1 and 41/9.9: the interval is inside 3.86x to 4.14x
    assert re.fullmatch(
        r"A forward pass takes 10\.0 ms on average \(small\) to 40\.0 ms \(large\), with 4\.00x the parameters; "
        r"large against small: 4\.00x the time \(interval (3\.8[6-9]|3\.9\d)x to (4\.0\d|4\.1[0-4])x, of the means\)\.",
        lines[0],
    ), lines[0]
    assert lines[1] == (
        "The backward pass (train-step rows) against the forward pass: 2.00x to 2.50x the time at all 2 models; "
        "the highest at large, its interval clear of every other's."
    )
    assert lines[2] == (  # 3 / 33 and 6 / 146
        "The optimizer step as a share of a training step: 4.11% to 9.09% at all 2 models; the highest at small, "
        "its interval clear of every other's."
    )
    assert "at most 12.0%" in lines[3] and "the noisiest row: large forward; 1 of 4 rows are above 10%" in lines[3]


def test_warmup_observations_read_each_run_against_its_own_later_steps():
    """Each run's first step against its own later steps; the runs' medians (fresh processes) only as a
    range, never ranked; a run measured under load says so."""
    rows = []
    runs = ((0, [30.0, 10.0, 10.2, 9.9]), (1, [10.5, 11.1, 10.9, 11.0]), (2, [11.2, 11.0, 10.0, 10.5]))
    for warmup, times_ in (*runs, (5, [10.0, 10.1, 9.9, 10.0])):
        load = 1.5 if warmup == 2 else 0.0
        rows += [
            {"warmup_steps": warmup, "step_index": i, "measured": True, "step_ms": t, "other_load_cores": load}
            for i, t in enumerate(times_)
        ]
    rows.append({"warmup_steps": 5, "step_index": -1, "measured": False, "step_ms": 99.0})  # a warmup step: not read
    lines = warmup_observations(rows)
    assert lines[0] == (
        "Without warmup the first measured step took 30.0 ms, 3.00x the median of the run's later steps (10.0 ms): "
        "above that run's later steps (9.90 to 10.2 ms) by more than their whole spread."
    )
    assert lines[1] == (
        "After 1 warmup step the first measured step took 10.5 ms, 0.95x the median of the run's later steps "
        "(11.0 ms): within the range of that run's later steps (10.9 to 11.1 ms)."
    )
    assert lines[2].startswith("After 2 warmup steps the first measured step took 11.2 ms, 1.07x the median")
    assert "just above that run's later steps (10.0 to 11.0 ms), by less than their spread" in lines[2]
    assert "other processes kept up to 1.5 cores busy while these rows were measured, so a slow" in lines[2]
    assert lines[3].startswith("After 5 warmup steps the first measured step took 10.0 ms, 1.00x")
    assert "within the range of that run's later steps" in lines[3]
    assert lines[4].startswith("The runs' medians of their later steps range from 10.0 to 11.0 ms:")
    assert not any(word in " ".join(lines) for word in ("faster", "slower", "+10%", "-"))


def test_checkpoint_observations_name_the_lowest_and_its_neighbours():
    rows = [
        _bench(checkpoint_blocks=None, peak_memory_bytes=100.0, step_ms=[10.0, 10.1, 9.9, 10.0]),
        _bench(checkpoint_blocks=1, peak_memory_bytes=60.0, step_ms=[13.0] * 4),
        _bench(checkpoint_blocks=2, peak_memory_bytes=50.0, step_ms=[13.0, 13.1, 12.9, 13.0]),
        _bench(checkpoint_blocks="all", peak_memory_bytes=70.0, step_ms=[14.0] * 4),
    ]
    lines = checkpoint_observations(rows)
    assert lines[0].startswith(
        "The lowest peak is with 2 blocks per checkpointed group: -50% against no checkpointing; its step time "
        "against no checkpointing's: +30% (interval +2"
    )
    assert lines[1:] == [
        "1 blocks per group: peak +20% against the lowest.",
        "all blocks per group: peak +40% against the lowest.",
    ]


def test_attention_observations_find_the_first_oom_and_the_quadratic_growth():
    rows = [
        {
            "head_dim": 16,
            "context_length": n,
            "status": "ok",
            "memory_before_backward_bytes": 4.0 * n * n,
            "forward_median_ms": 0.001 * n * n,
            "scores_bytes": 4 * n * n,
        }
        for n in (256, 512, 1024)
    ] + [{"head_dim": 16, "context_length": 4096, "status": "oom"}]
    lines = attention_observations(rows)
    assert lines[0].startswith("The first out-of-memory is at sequence length 4096 (head dim 16); 1 of 4 shapes")
    assert "memory held before backward grows as sequence^2.0, forward median time as sequence^2.0" in lines[1]
    busy = attention_observations([{**row, "other_load_cores": 1.2} for row in rows])  # a slope compares times
    assert "forward time not compared (other processes kept up to 1.2 cores busy" in busy[1]
    assert "At sequence length 1024 the score matrix alone is 4.00 MiB" in lines[2]


def test_ddp_observations_say_when_communication_is_not_measurable():
    exposed = "step - no_sync step (exposed)"
    rows = [
        {"strategy": "single", "world_size": 1, "status": "ok", "median_ms": 5.0, "step_ms": [5.0, 5.1, 4.9, 5.0]},
        {
            **{"strategy": "naive", "world_size": 2, "status": "ok", "median_ms": 20.0, "step_ms": [20.0, 20.2, 19.8]},
            **{"comm_ms": 15.0, "comm_pct": 75.0, "comm_step_ms": [15.0, 15.1, 14.9]},
        },
        {"strategy": "flat", "world_size": 2, "status": "ok", "median_ms": 10.0, "comm_ms": 5.0, "comm_pct": 50.0},
        {
            **{"strategy": "zero1", "world_size": 2, "status": "ok", "median_ms": 12.0, "comm_ms": -1.0},
            **{"comm_pct": -8.0, "comm_method": exposed, "comm_step_ms": [-31.2, -13.2, 75.9]},
        },
    ]
    rows[2]["comm_step_ms"] = [5.0, 5.1, 4.9]
    lines = ddp_observations(rows)
    assert lines[0].startswith("naive on 2 ranks: median step 20.0 ms, of which 15.0 ms communicating (75.0% of it)")
    assert "; its step against one process: +300% (interval +" in lines[0]
    assert lines[2].startswith(
        "zero1 on 2 ranks: median step 12.0 ms; exposed communication: per-step differences -31.2..+75.9 ms straddle 0"
    )
    assert lines[3].startswith("One flat all-reduce against one all-reduce per parameter tensor: -67% (interval")


def test_held_observations_compare_each_strategy_with_ddp():
    mib = 2**20
    rows = [
        {
            "strategy": "ddp",
            "world_size": 2,
            "status": "ok",
            "param_bytes_per_rank": 4 * mib,
            "optimizer_state_bytes_per_rank": 8 * mib,
        },
        {
            "strategy": "zero1",
            "world_size": 2,
            "status": "ok",
            "param_bytes_per_rank": 4 * mib,
            "optimizer_state_bytes_per_rank": 4 * mib,
        },
    ]
    assert held_observations(rows, "ddp") == [
        "zero1: parameters 4.00 MiB (1.00x of ddp's), optimizer state 4.00 MiB (0.50x of ddp's)."
    ]


def test_the_all_gather_sentence_reads_the_medians_the_table_shows():
    """The table's step column is the median: the sentence beside it must not quote the mean."""
    row = {"strategy": "fsdp2", "world_size": 2, "status": "ok", "fsdp_all_gather_ms": 9.41}
    row |= {"median_ms": 45.5, "mean_ms": 43.5, "forward_median_ms": 10.7, "forward_mean_ms": 13.0}
    assert gather_observations([row]) == [
        "fsdp2: the all-gathers were in flight 9.41 ms of one profiled step, against a median forward of 10.7 ms "
        "in a median step of 45.5 ms."
    ]


def test_precision_observations_follow_the_size():
    def steps(median):  # a row's own steps, as a JSONL row keeps them
        return {"step_ms": [median * f for f in (0.99, 1.0, 1.01, 1.0, 1.005)]}

    rows = [
        _bench("small", num_params=1, pass_type="forward", precision="fp32", **steps(10.0)),
        _bench("small", num_params=1, pass_type="forward", precision="bf16", step_ms=[9.0, 11.0, 10.2, 12.5, 9.5]),
        _bench("xl", num_params=9, pass_type="forward", precision="fp32", **steps(100.0)),
        _bench("xl", num_params=9, pass_type="forward", precision="bf16", **steps(40.0)),
    ]
    (line,) = precision_observations(rows)  # one sentence per pass, over the models
    assert line.startswith(
        "bf16 autocast (forward) against fp32: 2.50x as fast at 1 of 2; the highest at xl, its interval clear of "
        "every other's; cannot tell at 1 of 2, up to ±"
    )


def test_versus_observations_rank_only_what_the_noise_resolves():
    from cs336_systems.handout.problems.attention import versus_observations

    def row(implementation, context, samples):
        shape = {"head_dim": 16, "context_length": context, "precision": "fp32"}
        return {"implementation": implementation, "status": "ok", **shape, "forward_samples_ms": samples}

    rows = [
        row("naive", 128, [2.0, 2.02, 1.98, 2.0]),
        row("compiled", 128, [1.0, 1.01, 0.99, 1.0]),  # 2x: resolved
        row("naive", 256, [4.0, 6.0, 3.0, 5.0]),
        row("compiled", 256, [4.5, 3.5, 5.5, 4.0]),  # the same within the noise
    ]
    (line,) = versus_observations(rows, "naive", "compiled")
    assert line.startswith("compiled (forward) against naive: 2.00x as fast at 1 of 2; the highest at head dim 16,")
    assert "sequence 128 (fp32), its interval clear of every other's; cannot tell at 1 of 2, up to ±" in line
    # slower at every shape: a ratio under 0.1x keeps its digits
    slower = [
        row("naive", 128, [1.0, 1.01, 0.99, 1.0]),
        row("flash", 128, [8.0, 8.1, 7.9, 8.0]),
        row("naive", 256, [1.0, 1.01, 0.99, 1.0]),
        row("flash", 256, [260.0, 262.0, 258.0, 260.0]),
    ]
    (line,) = versus_observations(slower, "naive", "flash")
    assert line.startswith("flash (forward) against naive: 0.0038x to 0.12x as fast at all 2 shapes; the highest")


def test_the_same_within_the_noise_only_where_the_interval_lies_inside_the_band():
    """Samples wholly apart are never 'the same'; the same needs the whole interval within 5% of 1, and an
    interval wider than that (crossing 1) cannot tell; a busy machine's rows are not compared at all."""
    from cs336_systems.report.observe import SAME, UNTOLD, say, versus

    def row(samples, load=0.0):
        return {"step_ms": samples, "other_load_cores": load}

    same = versus(row([10.0, 10.1, 9.9, 10.0, 10.05]), row([10.0, 10.05, 9.95, 10.0, 10.1]))
    assert same.verdict == SAME and same.low >= 0.95 and same.high <= 1.05
    assert say(same, "a", "b").startswith("a against b: the same within ±5% (interval 0.99x to 1.0")
    wide = versus(row([8.0, 12.0, 10.0, 9.0, 11.0]), row([10.0, 10.1, 9.9, 10.0, 10.0]))
    assert wide.verdict == UNTOLD and say(wide, "a", "b").startswith("a against b: cannot tell, ±")
    # the flash rows: 21x slower, every sample of one above every sample of the other, under load
    flash, naive = [21.0, 22.0, 20.5, 21.5], [1.0, 1.02, 0.98, 1.01]
    busy = say([(versus(row(flash, 1.7), row(naive, 1.7)), "d 16")] * 2, "flash", "naive", "speed", "shapes")
    assert busy == (
        "flash against naive: not compared at all 2 shapes (other processes kept up to 1.7 cores busy while "
        "these rows were measured)"
    )
    quiet = versus(row(flash), row(naive))
    assert say(quiet, "flash", "naive").startswith("flash against naive: 0.047x as fast (interval 0.04")
    too_few = versus(row([1.0, 2.0]), row(naive))
    assert say(too_few, "a", "b") == "a against b: not compared (too few steps: 2 and 4)"
    threads = versus({**row(flash), "num_threads": 1}, {**row(naive), "num_threads": 2})
    assert say(threads, "a", "b").endswith("(measured with 1 and 2 threads)")


def test_a_ratio_keeps_two_significant_figures_below_a_tenth():
    from cs336_systems.report.document import times

    assert [times(v) for v in (0.0038, 0.05, 0.0995, 0.5, 1.234, 12.34)] == [
        "0.0038x",
        "0.050x",
        "0.10x",
        "0.50x",
        "1.23x",
        "12.3x",
    ]


def test_a_check_against_a_tolerance_reads_as_the_rows_verdict():
    from cs336_systems.handout.problems.attention import correctness

    def row(status, out, grad):
        return {"implementation": "flash-pytorch", "status": status, "max_abs_err_out": out}, grad

    rows = [
        {**row("ok", 1e-3, None)[0], "max_abs_err_grad": 3.5e-2, "check_tolerance": 3e-2},
        {**row("ok", 2e-3, None)[0], "max_abs_err_grad": 1e-2, "check_tolerance": 3e-2},
    ]
    (line,) = correctness(rows, "flash-pytorch")
    assert line.startswith(
        "Checked against fp32 attention: passed (largest output error 2.0e-03, gradient error 3.5e-02"
    )
    rows[1]["status"] = "wrong"
    assert correctness(rows, "flash-pytorch")[0].startswith("Checked against fp32 attention: failed at 1 of 2 shapes")


def test_the_residual_stream_answer_is_at_the_handouts_reference_model_whatever_scale_ran():
    """(d) asks for the 2.7B (2025) or xl (2026) model at batch 4: 4 x 128 x 2560 x 4 bytes = 5 MiB."""
    from cs336_systems.handout.problems.memory import residual_stream

    small_row = {"batch_size": 2, "context_length": 128, "d_model": 512, "model": "d512"}
    first, measured = residual_stream([small_row], "2025")
    assert first.startswith("At the handout's reference hyperparameters (2.7B, d_model 2560, batch 4)")
    assert "context 128: 4 x 128 x 2560 x 4 bytes = 5.00 MiB" in first and "context 512:" in first
    assert measured.endswith("batch 2 x context 128 x d_model 512 x 4 bytes = 0.50 MiB (d512).")
    (xl,) = residual_stream([], "2026")
    assert "(xl, d_model 2560, batch 4)" in xl and "context 2048: 4 x 2048 x 2560 x 4 bytes = 80.00 MiB" in xl


def test_a_letter_no_step_answers_is_not_measured_and_its_problem_only_partly():
    """Without Nsight Systems the torch profiler answers nsys_profile (b-e); (a) is Nsight's own figure."""
    from cs336_systems.handout.writeup import checklist_frame

    plan = pd.DataFrame(
        [
            {"edition": "2025", "problem": "nsys_profile", "step": "nsys_profile-torch_profiler-small",
             "part": "(b-e) torch profiler, not Nsight Systems (no GPU)", "outcome": "ok", "reductions": None},
        ]
    )  # fmt: skip
    row = checklist_frame(plan).loc["nsys_profile"]
    assert row["sub-questions"] == "a not measured; b measured; c measured; d measured; e measured"
    assert row["status"] == "partly measured"


def test_a_letter_not_measured_here_points_to_the_gpu_command_only_where_that_plan_measures_it():
    """nsys screenshots of DDP overlap are no step's on any device; Nsight's forward time is, on a GPU."""
    from cs336_systems.handout.problems.base import gpu_plan_letters

    assert "b" not in gpu_plan_letters("2026", "ddp_overlap_individual_parameters_benchmarking")
    assert "a" in gpu_plan_letters("2026", "nsys_profile") and "a" in gpu_plan_letters("2025", "nsys_profile")
    text = (WRITEUP / "writeup.md").read_text()
    overlap = text[text.index("\n## ddp_overlap_individual_parameters_benchmarking:") :].split("\n## ")[1]
    assert (
        "(b) nsys screenshots showing overlap present versus absent in naive DDP: not measured by this tool" in overlap
    )


def test_no_sentence_compares_two_rows_when_either_was_measured_on_a_busy_machine():
    """Each row's steps say nothing of what the load did to the other row: under two busy loops a 1 ms
    forward had 255 ms steps, and bf16 'ran 225.9x as fast' as fp32 with a tight interval."""
    from cs336_systems.report.observe import say, versus

    def row(samples, load):
        return {"step_ms": samples, "other_load_cores": load}

    fast, slow = [1.0, 1.01, 0.99, 1.0, 1.0], [255.0, 256.0, 254.0, 255.0, 255.5]
    assert say(versus(row(fast, 0.0), row(slow, 0.1)), "a", "b").startswith("a against b: 25")  # quiet: 255x
    loaded = say(versus(row(fast, 0.0), row(slow, 1.01)), "a", "b")
    assert (
        loaded == "a against b: not compared (other processes kept up to 1.0 cores busy while these rows were measured)"
    )


def test_a_status_compares_what_ran_with_what_the_handout_asks():
    """'measured' only at the handout's shapes (its own plan's flags); a small-scale run is 'reduced', saying
    what and against what; a letter whose section says its rows cannot answer it is never 'measured'."""
    from pathlib import Path

    from cs336_systems.handout.parameters import SMALL, Options
    from cs336_systems.handout.problems import PROBLEMS
    from cs336_systems.handout.problems.base import handout_plan
    from cs336_systems.handout.target import assumed_target
    from cs336_systems.handout.writeup import checklist_frame

    def plan(label, steps):
        return pd.DataFrame(
            [{"edition": "2026", "problem": label, "step": s.id, "part": s.part, "outcome": "ok", "reductions": None,
              "command": s.shell(Path("."))} for s in steps]
        )  # fmt: skip

    asked = checklist_frame(plan("pytorch_attention", handout_plan("2026", "pytorch_attention"))).loc[
        "pytorch_attention"
    ]
    assert (asked["status"], asked["sub-questions"], asked["why"]) == ("measured", "a measured", "nothing left out")
    small = PROBLEMS["pytorch_attention"].plan(Options("2026", SMALL, "cpu"), assumed_target("H100 80GB"))
    row = checklist_frame(plan("pytorch_attention", small)).loc["pytorch_attention"]
    assert (row["status"], row["sub-questions"]) == ("reduced", "a reduced")
    assert row["why"] == (
        "less than the handout asks: --context-lengths 64 128 (handout: 256 1024 4096 8192 16384); --head-dims 16 32 "
        "(handout: 16 32 64 128); --batch-sizes 4 (handout: 8); --measure-steps 10 (handout: 100)"
    )
    nsys = [s for s in handout_plan("2026", "nsys_profile")]
    unable = checklist_frame(plan("nsys_profile", nsys), {"nsys_profile": {"e"}}).loc["nsys_profile"]
    assert unable["sub-questions"].endswith("e not measured") and unable["status"] == "partly measured"
    assert "(e) not measured here: its section says why" in unable["why"]


def test_a_sub_question_every_observation_says_it_cannot_answer_is_not_answered():
    from cs336_systems.handout.problems.base import cannot_answer
    from cs336_systems.report.document import Bullets, Heading, Section

    section = Section("nsys_profile", "nsys_profile").add(
        Heading("(b-e) The longest operators"),  # a heading names (e) too: it answers nothing by itself
        Bullets(
            ["(b) forward: the longest is `aten::mm`.", "(e) Context 32: so the two cannot be compared here."], spec={}
        ),
    )
    assert cannot_answer(section) == {"e"}
