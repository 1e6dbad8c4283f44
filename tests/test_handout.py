"""`python -m cs336_systems.handout`: the plan of both editions for a GPU we do not have, fit and budget
from the predictions, bad input, a real small run into a write-up, and a stopped run that continues."""

from __future__ import annotations

import fcntl
import json
import os
import re

import pandas as pd
import pytest

from cs336_systems.config import BenchmarkConfig
from cs336_systems.handout import cli, outputs, run
from cs336_systems.handout.budget import fit_budget, parse_duration, total_seconds, wall_seconds
from cs336_systems.handout.parameters import FULL, SMALL, Options
from cs336_systems.handout.plan import predicted_peak
from cs336_systems.handout.problems import EDITIONS, PROBLEMS, build_steps, of_edition
from cs336_systems.handout.target import Target, assumed_target
from cs336_systems.models import ModelConfig
from cs336_systems.results.paths import lock_path
from tests.helpers import REPO


def measured_problems(edition: str) -> list[str]:
    return [problem.label for problem in of_edition(edition, "measured")]


H100 = "H100 80GB"


def plan_for(edition: str, device: str = H100, **options):
    target = assumed_target(device)
    return build_steps(Options(edition, FULL, "cuda", **options), target, list(EDITIONS[edition])), target


@pytest.mark.parametrize("edition", ["2025", "2026"])
def test_dry_run_for_an_assumed_h100_covers_every_problem_of_the_edition(edition, capsys):
    assert cli.main(["--edition", edition, "--assume-device", H100]) == 0
    out = capsys.readouterr().out
    assert f"Plan for the {edition} handout, full scale, on H100, 80.00 GiB, 1 GPU (assumed)" in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    for problem in measured_problems(edition):
        assert any(line.startswith(f"| {problem} ") for line in table), problem
    not_measured = next(line for line in out.splitlines() if line.startswith("Not measured"))
    assert all(p.label in not_measured for p in of_edition(edition) if p.kind != "measured")
    commands = out.split("Commands:")[1]
    assert "cs336-bench run_benchmarks" in commands and "--device cuda" in commands
    assert f"results/handout-{edition}-h100/" in commands
    assert ("gradient_checkpointing" in out) == (edition == "2026")


def test_a_configuration_predicted_not_to_fit_is_a_skipped_step_with_its_bytes():
    steps, target = plan_for("2026")
    by_id = {step.id: step for step in steps}
    # 10B of the 2026 table: forward fits in 80 GiB, a training step (parameters + AdamW ~ 190 GiB) does not
    assert by_id["benchmarking_script-b-10B"].status == "run"
    assert by_id["benchmarking_script-b-10B"].flags["--pass-types"] == ["forward"]
    skipped = by_id["benchmarking_script-b-10B-train-step-skipped"]
    assert skipped.status == "skipped" and skipped.predicted_peak_bytes > target.memory_bytes
    assert "does not fit" in skipped.reason and "of 80.00 GiB" in skipped.reason
    # checkpointing is what makes xl at context 2048 fit: those block sizes run, no checkpointing is skipped
    checkpointing = [s for s in steps if s.problem == "gradient_checkpointing"]
    running = [s for s in checkpointing if s.status == "run"]
    assert running and all("0" not in s.flags["--checkpoint-blocks"] for s in running)
    assert any(s.id.endswith("-0-skipped") for s in checkpointing)
    # one GPU: the data-parallel problems run on gloo CPU ranks at a small shape, and say so
    ddp = by_id["naive_ddp_benchmarking"]
    assert ddp.flags["--backend"] == "gloo" and any("gloo ranks on CPU" in r for r in ddp.reductions)
    assert by_id["distributed_communication_single_node-nccl"].status == "skipped"


def test_the_budget_shrinks_measured_steps_then_contexts_then_skips_the_last_problems():
    steps, target = plan_for("2025")
    before = total_seconds(steps)
    notes = fit_budget(steps, 600.0, target, user_model=False)
    assert total_seconds(steps) <= 600.0 < before
    assert notes == ["fewer measured steps", "fewer contexts", "later problems skipped"]
    first = steps[0]
    assert first.status == "run" and first.flags["--measure-steps"] == 5
    assert "--measure-steps 10 -> 5 (--budget)" in first.reductions
    assert steps[-1].status == "skipped"
    assert any(s.reason.startswith("over --budget") for s in steps)


def test_with_jobs_at_once_the_budget_counts_wall_time_each_step_on_the_lane_free_first():
    from cs336_systems.handout.plan import Step

    steps = [Step(name, "p", "x", "m", {}) for name in "abcd"]
    for step, seconds in zip(steps, (40.0, 30.0, 20.0, 25.0)):
        step.predicted_s = seconds
    # two lanes: a 0-40, b 0-30, c 30-50, d 40-65; one lane: 115; unbounded: the longest, 40
    assert (wall_seconds(steps, 1), wall_seconds(steps, 2), wall_seconds(steps, None)) == (115.0, 65.0, 40.0)
    assert fit_budget(steps, 65.0, CPU, user_model=False, lanes=2) == []
    fit_budget(steps, 60.0, CPU, user_model=False, lanes=2)  # d would end at 65 on its lane
    assert [s.status for s in steps] == ["run", "run", "run", "skipped"]
    assert steps[3].reason == "over --budget: predicted 25 s, 20 s left"


def test_a_roomy_budget_changes_nothing():
    steps, target = plan_for("2025")
    assert fit_budget(steps, 1e9, target, user_model=False) == []
    assert not any(step.reductions and "--budget" in " ".join(step.reductions) for step in steps)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--assume-device", "H100"], "give the memory size too"),
        (["--assume-device", "Z9000 80GB"], "not in the peak FLOP/s table"),
        (["--problems", "no_such_problem"], "--problems no_such_problem: unknown"),
        (["--edition", "2025", "--problems", "fsdp"], "a problem of the other edition"),
        (["--problems", "flash_forward"], "--problems flash_forward: an implementation the official tests check"),
        (["--problems", "tp_calcs"], "--problems tp_calcs: a derivation on paper"),
        (["--budget", "soon"], "expected a duration"),
        (["--budget", "0", "--dry-run"], "--budget '0': must be more than zero"),
        (["--budget", "", "--dry-run"], "--budget ''"),
        (["--assume-device", ""], "--assume-device '': name the GPU"),
        (["--device", "cpu", "--adapters", "no_such_adapters_module", "--dry-run"], "no_such_adapters_module"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_durations():
    assert parse_duration("45m") == 2700 and parse_duration("1h30m") == 5400 and parse_duration("90") == 90


SMALL_RUN = ["--edition", "2025", "--device", "cpu", "--scale", "small"]


@pytest.mark.slow
def test_a_small_run_writes_the_write_up_and_a_stopped_run_continues_without_repeating_a_step(tmp_path, monkeypatch):
    out = tmp_path / "handout"
    argv = [*SMALL_RUN, "--problems", "mixed_precision_accumulation", "pytorch_attention", "--output-dir", str(out)]
    real_run_step = run.run_step
    ran: list[str] = []

    def stop_at_the_second_step(step, output_dir, *progress):
        ran.append(step.id)
        if len(ran) == 2:
            raise KeyboardInterrupt  # as Ctrl-C while the second step runs
        return real_run_step(step, output_dir)

    monkeypatch.setattr(run, "run_step", stop_at_the_second_step)
    assert cli.main(argv) == 130
    plan = pd.read_csv(out / run.PLAN_FILE)
    assert plan.set_index("step")["outcome"].to_dict() == {
        "mixed_precision_accumulation": "ok",
        "pytorch_attention": "interrupted",
    }
    marker = json.loads((out / ".handout" / "mixed_precision_accumulation.json").read_text())
    assert marker["exit_status"] == 0
    printed = (out / "mixed_precision_accumulation.txt").read_text()
    assert "fp16" in printed

    ran.clear()
    monkeypatch.setattr(
        run, "run_step", lambda step, output_dir, *progress: (ran.append(step.id), real_run_step(step, output_dir))[1]
    )
    assert cli.main(argv) == 0
    assert ran == ["pytorch_attention"]  # the finished step is not run again
    assert (out / "mixed_precision_accumulation.txt").read_text() == printed
    rows = pd.read_csv(out / "pytorch_attention.csv")
    assert len(rows) == len(rows.drop_duplicates(["implementation", "head_dim", "context_length"])) == 4
    plan = pd.read_csv(out / run.PLAN_FILE)
    assert set(plan.loc[plan["plan_status"] != "skipped", "outcome"]) == {"ok"}

    writeup = (out / "writeup.md").read_text()
    for heading in (
        "## What was measured, where",
        "## mixed_precision_accumulation: Mixed-Precision Accumulation",
        "## pytorch_attention: PyTorch Attention Benchmarking",
        "## The plan and its commands",
    ):
        assert heading in writeup
    nsys = writeup[writeup.index("## nsys_profile") :].split("\n## ")[0]
    assert "left it out (--problems)" in nsys and "|" not in nsys  # every problem named, only two measured
    assert "Small scale" in writeup and "- pytorch_attention: `cs336-bench attention_bench" in writeup
    assert (out / "writeup.tex").is_file() and (out / "writeup.typ").is_file()
    pdf = out / "writeup.pdf"
    assert not pdf.exists() or pdf.read_bytes().startswith(b"%PDF")


def test_an_unfinished_sweep_continues_with_its_own_resume_and_any_other_step_starts_from_empty_outputs(tmp_path):
    from cs336_systems.handout.plan import Step

    sweep = Step("sweep", "p", "a sweep", "cs336_systems.benchmark_direct", {"--output": ["sweep.csv"]}, resumable=True)
    other = Step("other", "p", "attention", "cs336_systems.attention_bench", {"--output": ["other.csv"]})
    (tmp_path / ".handout").mkdir()
    outputs.claim(tmp_path, ["sweep.csv", "other.csv"])  # written by handout
    for name in ("sweep.csv", "other.csv", "theirs.csv"):
        (tmp_path / name).write_text("partial rows\n")
    assert run.prepare(sweep, tmp_path)[-1] == "--resume" and (tmp_path / "sweep.csv").exists()
    assert "--resume" not in run.prepare(other, tmp_path) and not (tmp_path / "other.csv").exists()
    theirs = Step("theirs", "p", "attention", "cs336_systems.attention_bench", {"--output": ["theirs.csv"]})
    run.prepare(theirs, tmp_path)
    assert (tmp_path / "theirs.csv").exists()  # not handout's: never removed


def test_a_done_marker_counts_only_for_the_same_command(tmp_path):
    from cs336_systems.handout.plan import Step

    step = Step("s", "p", "x", "cs336_systems.attention_bench", {"--measure-steps": 10})
    run.marker_path(tmp_path, step).parent.mkdir()
    run.marker_path(tmp_path, step).write_text(json.dumps({"command": step.shell(tmp_path), "outcome": "ok"}))
    assert run.read_marker(tmp_path, step)["outcome"] == "ok"
    step.flags["--measure-steps"] = 5  # e.g. another --budget: the step runs again
    assert run.read_marker(tmp_path, step) is None


def test_a_done_marker_is_trusted_only_while_its_outputs_are_there_and_whole(tmp_path):
    from cs336_systems.handout.plan import Step

    step = Step("s", "p", "x", "cs336_systems.attention_bench", {"--output": ["rows.csv"]})
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    marker = {"command": step.shell(tmp_path), "outcome": "ok", "outputs": {"rows.csv": 8}}
    run.marker_path(tmp_path, step).parent.mkdir()
    run.marker_path(tmp_path, step).write_text(json.dumps(marker))
    assert run.read_marker(tmp_path, step)["outcome"] == "ok"
    (tmp_path / "rows.csv").write_text("a,b\n1,")  # cut short
    assert run.read_marker(tmp_path, step) is None
    (tmp_path / "rows.csv").unlink()
    assert run.read_marker(tmp_path, step) is None


def test_a_done_marker_notices_an_output_edited_in_place_to_the_same_size_and_the_step_runs_again(
    tmp_path, monkeypatch, capsys
):
    from cs336_systems.handout.plan import Step

    step = Step("s", "p", "x", "cs336_systems.attention_bench", {"--output": ["rows.csv"]})
    runs = []

    def run_step(step, output_dir, *progress):
        runs.append(step.id)
        (output_dir / "rows.csv").write_text("a,b\n1,2\n")
        return 0, 0.1

    monkeypatch.setattr(run, "run_step", run_step)
    run.execute([step], assumed_target("H100 80GB"), tmp_path, "2026", "small")
    assert run.read_marker(tmp_path, step) is not None and runs == ["s"]
    (tmp_path / "rows.csv").write_text("a,b\n9,2\n")  # the same size, another number
    assert run.read_marker(tmp_path, step) is None
    capsys.readouterr()
    run.execute([step], assumed_target("H100 80GB"), tmp_path, "2026", "small")
    assert runs == ["s", "s"] and (tmp_path / "rows.csv").read_text() == "a,b\n1,2\n"
    assert "s: rows.csv changed since the step finished" in capsys.readouterr().err


@pytest.mark.parametrize("marker", ["none", "recording_it"])
def test_a_directory_with_markers_and_no_ledger_counts_as_handouts_only_what_they_recorded(
    tmp_path, monkeypatch, capsys, marker
):
    """A .handout/ that is not empty and has no ledger (an older handout's, or anything): a user's file
    named as an output is handout's only when a done marker there recorded it."""
    out, argv = _handout_dir(tmp_path, monkeypatch)
    (out / ".handout").mkdir(parents=True)
    (out / ".handout" / "notes.txt").write_text("not a ledger\n")
    (out / "pytorch_attention.csv").write_text("theirs\n")
    if marker == "recording_it":  # an older handout's done marker, its command other than today's
        record = {"command": "cs336-bench attention_bench --old", "outputs": {"pytorch_attention.csv": 7}}
        (out / ".handout" / "pytorch_attention.json").write_text(json.dumps(record))
    status = cli.main(argv)
    if marker == "none":
        assert status == 2 and (out / "pytorch_attention.csv").read_text() == "theirs\n"
        assert "pytorch_attention.csv is there and handout did not write it" in capsys.readouterr().err
    else:
        assert status == 0 and "pytorch_attention.csv" in outputs.written(out)
    assert "notes.txt" not in outputs.written(out)


def test_a_done_marker_nested_deep_or_a_directory_is_not_done_and_never_a_traceback(tmp_path, monkeypatch, capsys):
    from cs336_systems.handout.plan import Step

    step = Step("s", "p", "x", "cs336_systems.attention_bench", {"--output": ["rows.csv"]})
    run.marker_path(tmp_path, step).parent.mkdir()
    run.marker_path(tmp_path, step).write_text("[" * 200_000 + "]" * 200_000)  # a RecursionError before
    assert run.read_marker(tmp_path, step) is None and run.changed_outputs(tmp_path, step) is None
    assert run.recorded_by_markers([step], tmp_path) == []
    run.marker_path(tmp_path, step).unlink()
    run.marker_path(tmp_path, step).mkdir()
    assert run.read_marker(tmp_path, step) is None
    # the whole command: a marker's name taken by a directory, in a directory with no ledger
    out, argv = _handout_dir(tmp_path, monkeypatch)
    (out / ".handout" / "pytorch_attention.json").mkdir(parents=True)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert ".handout/pytorch_attention.json is not a regular file" in err and err.count("\n") == 1, err


def test_an_output_dir_name_past_the_filesystems_limit_is_one_line(tmp_path, monkeypatch, capsys):
    _, argv = _handout_dir(tmp_path, monkeypatch)
    too_long = tmp_path / ("d" * 300)
    for extra in ([], ["--dry-run"]):
        assert cli.main([*argv[:-2], "--output-dir", str(too_long), *extra]) == 2
        err = capsys.readouterr().err
        assert "a directory name is too long (300 bytes" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("status, retried", [(0, False), (1, False), (2, True), (-9, True)])
def test_a_step_that_crashed_or_was_refused_runs_again_next_time(tmp_path, monkeypatch, status, retried):
    from cs336_systems.handout.plan import Step
    from cs336_systems.handout.target import assumed_target

    step = Step("s", "p", "x", "cs336_systems.attention_bench", {"--output": ["rows.csv"]})

    def run_step(step, output_dir, *progress):
        (output_dir / "rows.csv").write_text("a\n1\n")
        return status, 0.1

    monkeypatch.setattr(run, "run_step", run_step)
    outcomes = run.execute([step], assumed_target("H100 80GB"), tmp_path, "2026", "small")
    assert outcomes["s"]["exit_status"] == status
    assert (run.read_marker(tmp_path, step) is None) == retried


def _handout_dir(tmp_path, monkeypatch, report_status: int = 0):
    """cli.main on a --dry-run-sized plan whose steps do not run (execute replaced), the write-up's
    report answering `report_status`."""
    from cs336_systems.report import cli as report_cli

    monkeypatch.setattr(cli, "execute", lambda steps, *args: {s.id: {"outcome": "ok"} for s in steps})
    monkeypatch.setattr(
        cli, "write_up", lambda *args: [] if report_status == 0 else ["writeup.pdf: could not be written"]
    )
    monkeypatch.setattr(report_cli, "main", lambda argv: 0)  # --verify
    out = tmp_path / "handout"
    return out, [*SMALL_RUN, "--problems", "pytorch_attention", "--output-dir", str(out)]


def test_a_write_up_that_failed_exits_1(tmp_path, monkeypatch, capsys):
    out, argv = _handout_dir(tmp_path, monkeypatch, report_status=1)
    assert cli.main(argv) == 1
    assert "error: the write-up is incomplete" in capsys.readouterr().err


PLANTS = ["theirs", "link", "logs_link", "markers_file", "marker_dir", "locked", "ledger_link", "partial_link"]


@pytest.mark.parametrize("plant", PLANTS)
def test_handout_writes_nothing_through_a_link_nor_over_a_file_it_did_not_write(tmp_path, monkeypatch, capsys, plant):
    out, argv = _handout_dir(tmp_path, monkeypatch)
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("theirs\n")
    words = {
        "theirs": "pytorch_attention.csv is there and handout did not write it",
        "link": "handout_plan.csv is a symbolic link",
        "logs_link": "logs is a symbolic link",
        "markers_file": ".handout is a file where handout keeps a directory",
        "marker_dir": ".handout/pytorch_attention.json is not a regular file",
        "locked": "another handout runs there",
        "ledger_link": ".handout/written is a symbolic link",  # read, it would name the victim's lines as handout's
        "partial_link": "pytorch_attention.csv is a symbolic link",  # a plan that ran partly, an output replaced
    }[plant]
    if plant == "theirs":
        (out / "pytorch_attention.csv").write_text("theirs\n")
    elif plant == "link":
        (out / "handout_plan.csv").symlink_to(victim)
    elif plant == "logs_link":
        (out / "logs").symlink_to(tmp_path)
    elif plant == "markers_file":
        (out / ".handout").write_text("")
    elif plant == "ledger_link":
        (out / ".handout").mkdir()
        (out / ".handout" / "written").symlink_to(victim)
    elif plant == "partial_link":
        (out / ".handout").mkdir()
        outputs.claim(out, [run.PLAN_FILE, "pytorch_attention.csv"])
        (out / "pytorch_attention.csv").symlink_to(victim)
    elif plant == "marker_dir":  # a done marker's name taken by a directory
        (out / ".handout" / "pytorch_attention.json").mkdir(parents=True)
        outputs.claim(out, [".handout/pytorch_attention.json"])
    else:  # another handout holds the directory's lock (flock: a second open file conflicts even here)
        held = os.open(lock_path(out / run.PLAN_FILE), os.O_RDWR | os.O_CREAT)
        fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert cli.main(argv) == 2
    finally:
        if plant == "locked":
            os.close(held)
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert victim.read_text() == "theirs\n" and not (tmp_path / "handout_plan.csv").exists()
    if plant == "theirs":
        assert (out / "pytorch_attention.csv").read_text() == "theirs\n"
    assert cli.main(argv[:-2] + ["--output-dir", str(tmp_path / "fresh")]) == 0  # a directory of its own runs


def test_the_writeup_opens_with_a_checklist_of_every_problem_and_escapes_what_its_rows_say(tmp_path):
    from cs336_systems.report.cli import main as report_main
    from cs336_systems.report.verify import parse_tables

    plan = pd.DataFrame(
        [
            dict(
                order=1,
                edition="2026",
                scale="full",
                problem="memory_profiling",
                step="memory_profiling-residuals",
                part="(f) what autograd saves per block",
                tool="cs336_systems.residuals",
                plan_status="run",
                outcome="ok",
                reason="",
                reductions="",
                predicted_peak_bytes=None,
                device_memory_bytes=2**30,
                predicted_s=15.0,
                elapsed_s=4.2,
                command="python -m cs336_systems.residuals --device cpu --output residuals.csv",
                reads="residuals.csv",
                text_output="",
                device_name="AMD EPYC",
                device_assumed=False,
            ),
            dict(
                order=2,
                edition="2026",
                scale="full",
                problem="nsys_profile",
                step="nsys_profile-small-128",
                part="nsys",
                tool="nsys_profile.sh",
                plan_status="skipped",
                outcome="skipped",
                reason="nsys profiles CUDA kernels: needs a GPU",
                reductions="",
                predicted_peak_bytes=None,
                device_memory_bytes=2**30,
                predicted_s=None,
                elapsed_s=None,
                command="",
                text_output="",
                device_name="AMD EPYC",
                device_assumed=False,
            ),
        ]
    )
    plan.to_csv(tmp_path / "handout_plan.csv", index=False)
    saved = dict(model_size="small", d_model=8, num_layers=1, batch_size=1, context_length=4, precision="fp32")
    pd.DataFrame(  # a submodule named with Markdown, Typst and LaTeX specials: shown as written everywhere
        [
            dict(saved, rank=1, module="ffn #_*$|x", op="MulBackward0", tensors=2, bytes=2**21, share_pct=75.0),
            dict(saved, rank=2, module="ln1", op="PowBackward0", tensors=1, bytes=2**19, share_pct=25.0),
        ]
    ).to_csv(tmp_path / "residuals.csv", index=False)
    from cs336_systems.handout.writeup import write_up

    assert write_up(tmp_path, ["Made by hand."], [".md", ".typ", ".tex"]) == []
    outputs = [tmp_path / f"writeup.{ext}" for ext in ("md", "typ", "tex")]
    markdown, typst, latex = (o.read_text() for o in outputs)
    first = markdown.index("## What was measured, where")
    assert first < markdown.index("## nsys_profile") < markdown.index("## memory_profiling")
    assert "- nsys: not measured here: nsys profiles CUDA kernels: needs a GPU. To measure it on a GPU:" in markdown
    checklist = next(t for t in parse_tables(markdown) if t.title == "Every problem of the edition")
    status = {row[0]: row[1] for row in checklist.rows}
    parts = {row[0]: row[2] for row in checklist.rows}
    # memory_profiling ran only its (f) step: its other letters are not measured, the problem only partly
    assert status["nsys_profile"] == "not measured" and status["memory_profiling"] == "partly measured"
    assert "b not measured" in parts["memory_profiling"] and "f measured" in parts["memory_profiling"]
    assert status["flash_forward"] == "code" and status["tp_calcs"] == "derivation" and len(status) == 27
    assert report_main([str(tmp_path / "handout_plan.csv"), "--output", str(tmp_path / "r.md")]) == 2  # the handout's
    residuals = next(t for t in parse_tables(markdown) if t.title.startswith("The five largest"))
    assert residuals.rows[0][:3] == ["1", "ffn #_*$|x", "MulBackward0"] and residuals.rows[0][4] == "2.00"
    assert '"ffn #_*$|x"' in typst and "ffn \\#\\_*\\$|x" in latex
    assert "The five largest hold 100% of it" in markdown or "the five largest hold 100% of it" in markdown
    assert report_main(["--verify", str(outputs[0]), str(tmp_path / "handout_plan.csv")]) == 0


def test_two_assumed_gpus_run_data_parallel_on_nccl_with_the_handouts_shape():
    steps, target = plan_for("2025", "2x H100 80GB")
    by_id = {step.id: step for step in steps}
    assert target.gpus == 2
    ddp = by_id["ddp_bucketed_benchmarking"]
    assert ddp.flags["--backend"] == "nccl" and ddp.flags["--model-size"] == "xl" and not ddp.reductions[:-1]
    assert ddp.flags["--bucket-cap-mb"] == ["1", "10", "100", "1000"]
    nccl = by_id["distributed_communication_single_node-nccl"]
    assert nccl.status == "run" and nccl.flags["--world-sizes"] == [2] and "4 6 dropped" in nccl.reductions[0]


HANDOUT_2026 = [
    "benchmarking_script",
    "nsys_profile",
    "mixed_precision_accumulation",
    "benchmarking_mixed_precision",
    "memory_profiling",
    "gradient_checkpointing",
    "pytorch_attention",
    "torch_compile",
    "flash_forward",
    "flash_backward",
    "flash_benchmarking",
    "distributed_communication_single_node",
    "naive_ddp",
    "naive_ddp_benchmarking",
    "minimal_ddp_flat_benchmarking",
    "ddp_overlap_individual_parameters",
    "ddp_overlap_individual_parameters_benchmarking",
    "optimizer_state_sharding",
    "optimizer_state_sharding_accounting",
    "fsdp",
    "fsdp_accounting",
    "alternate_ring_all_reduce",
    "data_parallel_calcs",
    "fsdp_calcs",
    "tp_calcs",
    "fsdp_tp_calcs",
    "leaderboard",
]


def test_every_problem_of_each_edition_in_the_handouts_order_with_a_kind_and_a_title():
    assert list(EDITIONS["2026"]) == HANDOUT_2026
    assert "ddp_bucketed_benchmarking" in EDITIONS["2025"] and "ddp_bucketed_benchmarking" not in EDITIONS["2026"]
    assert EDITIONS["2025"].index("leaderboard") == EDITIONS["2025"].index("flash_benchmarking") + 1
    kinds = {p: PROBLEMS[p].kind for p in EDITIONS["2026"]}
    assert [p for p, k in kinds.items() if k == "analytic"] == HANDOUT_2026[21:26]
    assert kinds["fsdp"] == kinds["naive_ddp"] == "implementation" and kinds["fsdp_accounting"] == "measured"
    assert PROBLEMS["communication_accounting"].kind == "analytic"
    assert PROBLEMS["nsys_profile"].title == "Nsight Systems Profiling"
    assert PROBLEMS["leaderboard"].title_in("2025") == "FlashAttention-2 Leaderboard"
    assert PROBLEMS["fsdp"].official_test == "tests/test_fsdp.py"
    every = {label for labels in EDITIONS.values() for label in labels}
    assert every == set(PROBLEMS)  # one registry: every problem of an edition is an object, and only those
    for label in every:  # a measured problem plans and writes; the others only write
        problem = PROBLEMS[label]
        assert problem.title and problem.write is not None
        assert (problem.plan is not None) == (problem.kind == "measured"), label
        assert (problem.official_test is not None) == (problem.kind == "implementation"), label
    for edition in EDITIONS:  # each step answers a measured problem of its edition
        steps, _ = plan_for(edition)
        assert {s.problem for s in steps} == set(measured_problems(edition))


def test_2026_is_planned_as_2026_on_an_h100():
    steps, target = plan_for("2026")
    by_id = {step.id: step for step in steps}
    assert not any("bucket" in s.id for s in steps)
    fsdp = by_id["fsdp_accounting"]
    assert (
        fsdp.problem == "fsdp_accounting" and fsdp.flags["--strategies"] == ["fsdp2"] and fsdp.part.startswith("(a, b)")
    )
    # nsys: two sizes x three powers of two above 128, the largest the longest whose training step fits
    nsys = [s for s in steps if s.problem == "nsys_profile"]
    contexts = {(s.flags["--model-size"], s.flags["--context-length"]) for s in nsys}
    assert contexts == {
        ("small", 1024),
        ("small", 2048),
        ("small", 4096),
        ("large", 256),
        ("large", 512),
        ("large", 1024),
    }
    assert {s.flags["--pass-type"] for s in nsys} == {"forward", "train-step"} and all(s.status == "run" for s in nsys)
    assert all(s.flags["--attention"] == "naive" and s.reads[0].endswith("_cuda_gpu_kern_sum.csv") for s in nsys)
    assert by_id["nsys_profile-small-4096-train-step"].part.startswith("(d) training step with torch's AdamW")
    # the leaderboard: a full bf16 training step under do_bench, at the largest configuration that fits, named
    board = by_id["leaderboard"]
    assert board.tool.endswith("benchmark") and board.status == "run"
    assert (board.flags["--pass-type"], board.flags["--precision"], board.flags["--timer"]) == (
        "train-step",
        "bf16",
        "do-bench",
    )
    assert (
        board.flags["--vocab-size"] == 151_936 and board.flags["--d-model"] == 4096 and board.flags["--batch-size"] == 2
    )
    assert board.flags["--num-layers"] < 34 and board.predicted_peak_bytes <= target.memory_bytes
    assert (
        f"{board.flags['--num-layers']} of 34 layers" in board.part
        and "smaller than the handout's" in board.reductions[0]
    )


def test_the_data_parallel_prediction_counts_the_adamw_state_of_a_training_step():
    steps, target = plan_for("2026", "2x A100 40GB")
    by_id = {step.id: step for step in steps}
    xl = ModelConfig.from_size("xl", "2026", context_length=512)
    train_step = predicted_peak(target, BenchmarkConfig(xl, context_length=512, batch_size=4, pass_type="train-step"))
    ddp = by_id["naive_ddp_benchmarking"]
    assert ddp.flags["--model-size"] == "xl" and ddp.predicted_peak_bytes == train_step > target.memory_bytes
    assert ddp.status == "skipped" and "does not fit" in ddp.reason
    # FSDP divides parameters, gradients and AdamW state over the two ranks: it fits where DDP does not
    fsdp = by_id["fsdp_accounting"]
    assert fsdp.status == "run" and fsdp.predicted_peak_bytes < target.memory_bytes
    # one process holds as much as one GPU's training step: no baseline step, each run has its own (oom) row
    assert "ddp_single" not in by_id and "--baseline" not in fsdp.flags and fsdp.reads == ("fsdp_accounting.csv",)


CPU = Target("AMD EPYC", "cpu", 24 * 2**30, 0, False, False, False, {"fp32": 0.5, "bf16": 0.1})


@pytest.mark.parametrize("edition", ["2025", "2026"])
def test_one_process_is_one_step_of_the_plan_that_every_data_parallel_step_reads(edition):
    from cs336_systems.handout.plan import benchmark_configs
    from cs336_systems.handout.problems import data_parallel

    steps = build_steps(Options(edition, SMALL, "cpu", "tests.adapters"), CPU, list(measured_problems(edition)))
    ddp = [step for step in steps if step.kind == "ddp"]
    [baseline] = [step for step in ddp if step.flags["--strategies"] == ["single"]]
    assert baseline.id == data_parallel.BASELINE_STEP and baseline.problem == "naive_ddp_benchmarking"
    others = [step for step in ddp if step is not baseline]
    assert len(others) == len([p for p in data_parallel.DDP_PROBLEMS if p in EDITIONS[edition]])
    for step in others:  # each against that one row, the configuration it was measured at
        assert step.flags["--baseline"] == data_parallel.BASELINE_FILE in step.reads and step.inputs()
        assert benchmark_configs(step) == benchmark_configs(baseline)
        assert step.flags.get("--optimizer") == baseline.flags.get("--optimizer")
        assert "single" not in step.flags["--strategies"]
        # ddp_bench runs no one-process unit for it; the prediction counts none
        assert not [u for u in units_of(step) if u.strategy == "single"]


def test_every_data_parallel_section_shows_the_one_process_row_it_was_measured_against(tmp_path):
    from cs336_systems.handout.problems import data_parallel
    from cs336_systems.handout.writeup import write_up
    from cs336_systems.report.cli import main as report_main
    from cs336_systems.report.verify import parse_tables
    from cs336_systems.results import read_results

    labels = ["naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking", "optimizer_state_sharding_accounting"]
    steps = build_steps(Options("2026", SMALL, "cpu"), CPU, labels)
    out = tmp_path / "out"
    out.mkdir()
    for step in steps:  # the committed rows, each step's strategies in its file, the one process in the baseline's
        committed = read_results(REPO / "writeup" / "2026" / f"{step.problem}.csv")
        mine = committed["strategy"].isin(step.flags["--strategies"])
        committed[mine].to_csv(out / f"{step.id}.csv", index=False)
    outcomes = {step.id: {"outcome": "ok", "exit_status": 0} for step in steps}
    run.write_plan(out / run.PLAN_FILE, run.plan_rows(steps, CPU, out, outcomes, "2026", "small"))
    assert write_up(out, [], [".md"]) == []
    text = (out / "writeup.md").read_text()
    single = read_results(out / data_parallel.BASELINE_FILE).iloc[0]
    shown = []
    for label in labels:
        section = text[text.index(f"\n## {label}:") :].split("\n## ")[1]
        table = next(t for t in parse_tables(section) if t.title == "Time per training step")
        [row] = [row for row in table.rows if row[0] == "single"]
        shown.append(row[table.header.index("step (ms)")])
        assert f"single: the row of {data_parallel.BASELINE_STEP}" in section  # which row, in every section
    assert len(set(shown)) == 1 and shown[0].startswith(f"{single['median_ms']:.3g}")
    assert report_main(["--verify", str(out / "writeup.md"), str(out / run.PLAN_FILE)]) == 0


def units_of(step):
    from cs336_systems.ddp_bench.cli import config_from_args, units_for

    args = step.args()
    return units_for(args, config_from_args(args, "cpu"), 2, first=True)


def test_a_small_cpu_plan_says_what_it_cannot_measure_and_keeps_the_command(tmp_path):
    steps = build_steps(Options("2026", SMALL, "cpu"), CPU, list(measured_problems("2026")))
    by_id = {step.id: step for step in steps}
    # no nsys and no GPU: the torch profiler's kernel table from a sweep, said so, its rows in JSONL
    [profiler] = [s for s in steps if s.problem == "nsys_profile"]
    assert "torch profiler, not Nsight Systems (no GPU)" in profiler.part and profiler.reads[0].endswith(".jsonl")
    assert profiler.flags["--context-lengths"] == [32, 64, 128] and profiler.status == "run"
    # GPU-only steps skip with one line and keep the command that would measure them
    rows = {row["step"]: row for row in run.plan_rows(steps, CPU, tmp_path, {}, "2026", "small")}
    for step_id in ("memory_profiling-snapshot-forward", "memory_profiling-snapshot-forward-timeline"):
        assert by_id[step_id].status == "skipped" and "GPU" in by_id[step_id].reason
        assert rows[step_id]["command"] and "\n" not in by_id[step_id].reason
    assert rows["memory_profiling-snapshot-forward-timeline"]["figures"] == "memory_profiling-snapshot-forward.png"
    assert rows["mixed_precision_accumulation"]["reads"] == "mixed_precision_accumulation.csv"
    # the leaderboard: a tiny named configuration on the host timer, labelled as such
    board = by_id["leaderboard"]
    assert board.status == "run" and board.flags["--timer"] == "host" and "tiny configuration" in board.part
    assert "the host timer (no GPU)" in board.part
    assert "a tiny configuration (small scale), not the handout's 8B configuration" in board.reductions


def test_2025_profiles_every_size_at_the_handouts_contexts():
    steps, _ = plan_for("2025")
    nsys = [s for s in steps if s.problem == "nsys_profile"]
    assert {(s.flags["--model-size"], s.flags["--context-length"]) for s in nsys if s.status == "run"} >= {
        ("small", 128),
        ("2.7B", 512),
    }
    assert {s.flags["--context-length"] for s in nsys} == {128, 256, 512, 1024}
    small = build_steps(Options("2025", SMALL, "cpu"), CPU, ["nsys_profile"])
    assert [s.flags["--context-lengths"] for s in small] == [[32, 64]]


@pytest.mark.parametrize("default, changed", [("measure_steps", 100), ("precision", "bf16")])
def test_a_tools_default_is_the_plans(monkeypatch, default, changed):
    """A step that leaves a flag to its tool is predicted with the tool's own default: change one of
    benchmark's defaults and the nsys steps (which give neither flag) are predicted with the new one."""
    from cs336_systems import benchmark

    def nsys(steps):
        return {s.id: (s.predicted_s, s.predicted_peak_bytes) for s in steps if s.id.startswith("nsys_profile")}

    before = nsys(plan_for("2026")[0])
    build = benchmark.build_parser

    def changed_default():
        parser = build()
        parser.set_defaults(**{default: changed})
        return parser

    monkeypatch.setattr(benchmark, "build_parser", changed_default)
    after = nsys(plan_for("2026")[0])
    assert before and after.keys() == before.keys()
    for step_id, (seconds, peak) in before.items():
        if default == "measure_steps":
            assert after[step_id][0] > seconds and after[step_id][1] == peak, step_id  # 100 steps, not 10
        elif step_id.endswith("forward"):  # the estimator of a bf16 autocast forward, not fp32
            assert after[step_id][1] != peak, step_id


def _sleeper(tmp_path, name: str, seconds: float, predicted_s: float):
    from cs336_systems.handout.plan import Step

    script = tmp_path / f"{name}.py"
    script.write_text(
        f"import sys, time\nprint('{name} working', file=sys.stderr, flush=True)\ntime.sleep({seconds})\n"
    )
    step = Step(name, "benchmarking_script", name, str(script), {"--output-dir": "."})
    step.predicted_s = predicted_s
    return step


def test_the_budget_holds_while_the_plan_runs(tmp_path):
    """A step predicted over what is left of --budget is not started; one still running at its end is
    stopped; neither is done, so the same command takes them up again."""
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    steps = [_sleeper(tmp_path, "long", 60, 1), _sleeper(tmp_path, "later", 0, 600)]
    outcomes = run.execute(steps, CPU, out, "2026", "small", budget_s=2.0)
    assert outcomes["long"]["outcome"] == "stopped at --budget" and outcomes["long"]["elapsed_s"] < 30
    assert outcomes["later"]["outcome"] == "over budget" and "predicted 600 s" in steps[1].reason
    assert not list((out / outputs.MARKERS).glob("*.json"))  # nothing marked done: the same command resumes both


def test_a_running_steps_progress_is_its_logs_last_line(tmp_path):
    out = tmp_path / "out"
    for folder in (".handout", "logs"):
        (out / folder).mkdir(parents=True)
    seen: list[str] = []
    step = _sleeper(tmp_path, "busy", 2.5, 1)
    status, _ = run.run_step(step, out, seen.append)
    assert status == 0 and "busy working" in seen


def test_the_plan_reads_the_repositorys_files_not_only_what_is_importable(tmp_path, monkeypatch, fresh_cs336_basics):
    """The official skeleton ships assignment 1's model and AdamW in cs336-basics/ (a uv workspace
    member): found there, and put on the path the steps import from, even where it is not installed."""
    import sys

    from cs336_systems.handout.problems.model_steps import STUDENT_ADAMW, STUDENT_MODEL, defined_in_repository

    package = tmp_path / "cs336-basics" / "cs336_basics"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("class BasicsTransformerLM:\n    pass\n")
    (package / "optimizer.py").write_text("import torch\n\n\nclass AdamW(torch.optim.Optimizer):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "student_repo" not in p])
    assert defined_in_repository(STUDENT_MODEL) and defined_in_repository(STUDENT_ADAMW)
    assert not defined_in_repository("cs336_basics.model:SomethingElse")
    assert str((tmp_path / "cs336-basics").resolve()) in sys.path


def test_a_model_factory_of_the_students_own_that_imports_cs336_basics_finds_it_uninstalled(
    tmp_path, monkeypatch, capsys, fresh_cs336_basics
):
    """A student's wrapper at the root (their assignment 1 model takes n_layers) imports cs336_basics, which
    lives in cs336-basics/ and is installed only by `uv sync`: the plan puts it on the path first."""
    import sys

    package = tmp_path / "cs336-basics" / "cs336_basics"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "blocks.py").write_text(
        (REPO / "tests" / "fixtures" / "student_repo" / "cs336_basics" / "model.py").read_text()
    )
    (tmp_path / "my_model.py").write_text("from cs336_basics.blocks import BasicsTransformerLM as build\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "student_repo" not in p] + [str(tmp_path)])
    argv = ["--device", "cpu", "--scale", "small", "--problems", "benchmarking_script", "--dry-run"]
    assert cli.main([*argv, "--model-factory", "my_model:build"]) == 0, capsys.readouterr().err
    assert str((tmp_path / "cs336-basics").resolve()) in sys.path


def test_a_model_that_cannot_run_here_is_one_line_before_any_step(tmp_path, capsys):
    """--model-factory's model is built on the plan's device and its logits checked before the first step:
    a model returning (logits, aux) is refused in seconds, and no step ran."""
    output_dir = tmp_path / "out"
    argv = ["--device", "cpu", "--scale", "small", "--problems", "benchmarking_script", "--output-dir", str(output_dir)]
    assert cli.main([*argv, "--model-factory", "tests.fixtures.hostile.models:logits_and_aux"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "tests.fixtures.hostile.models:logits_and_aux" in err[-1] and "tuple" in err[-1]
    assert not list(output_dir.glob("*.csv")) and not (output_dir / "writeup.md").exists()


def test_a_model_whose_own_code_fails_here_is_said_in_the_plan_and_the_built_in_model_measured(tmp_path, capsys):
    """A model that calls NVTX (CUDA builds only) cannot run on a CPU: the plan says so, the steps that would
    measure it measure the built-in model, each saying why, and the write-up's first line repeats it."""
    import pandas as pd

    output_dir = tmp_path / "out"
    argv = ["--device", "cpu", "--scale", "small", "--problems", "benchmarking_script", "--output-dir", str(output_dir)]
    assert cli.main([*argv, "--model-factory", "tests.fixtures.hostile.models:marks_with_nvtx"]) == 0
    err = capsys.readouterr().err
    assert "Your --model-factory model cannot run on" in err and "NVTX functions not installed" in err
    assert "The 2 steps that would measure it measure the built-in model instead" in err
    plan = pd.read_csv(output_dir / "handout_plan.csv")
    assert set(plan["outcome"]) == {"ok"} and not plan["command"].str.contains("--model-factory").any()
    assert plan["reductions"].str.contains("the built-in model: your --model-factory model cannot run").all()
    first = (output_dir / "writeup.md").read_text().splitlines()[2]
    assert "your --model-factory model could not run on this device" in first


def test_a_students_fsdp_on_their_model_costs_only_its_own_rows(tmp_path, monkeypatch, capsys):
    """fsdp_accounting with --adapters: the student's FSDP runs on their model in a step of its own, so
    a model of theirs that ddp_bench refuses (tuple logits) leaves the harness's fsdp2 and single rows,
    and '(a) Memory per rank' is filled from them."""
    import shutil

    from cs336_systems.handout.problems import data_parallel
    from cs336_systems.handout.problems.model_steps import STUDENT_MODEL
    from cs336_systems.handout.writeup import write_up
    from cs336_systems.report.cli import main as report_main
    from cs336_systems.report.verify import parse_tables

    monkeypatch.setattr(data_parallel, "defined_in_repository", lambda spec: spec == STUDENT_MODEL)
    steps = build_steps(Options("2026", SMALL, "cpu", "tests.adapters"), CPU, ["fsdp_accounting"])
    baseline, ours, yours = steps
    assert baseline.id == data_parallel.BASELINE_STEP and ours.flags["--baseline"] == data_parallel.BASELINE_FILE
    assert ours.id == "fsdp_accounting" and ours.flags["--strategies"] == ["fsdp2"]
    assert "--model-factory" not in ours.flags and "--adapters" not in ours.flags
    assert yours.flags["--strategies"] == ["adapter-fsdp"] and yours.flags["--model-factory"] == STUDENT_MODEL
    assert "--baseline" not in yours.flags  # their model: its own one-process row
    assert set(ours.outputs()).isdisjoint(yours.outputs())
    # the baseline and the harness's step ran (the committed rows); the student's was refused: no rows
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(REPO / "writeup" / "2026" / "fsdp_accounting.csv", out / "fsdp_accounting.csv")
    shutil.copy(REPO / "writeup" / "2026" / "fsdp_accounting.csv", out / data_parallel.BASELINE_FILE)
    outcomes = {step.id: {"outcome": "ok", "exit_status": 0} for step in (baseline, ours)}
    outcomes[yours.id] = {"outcome": "refused", "exit_status": 2}
    run.write_plan(out / run.PLAN_FILE, run.plan_rows(steps, CPU, out, outcomes, "2026", "small"))
    assert write_up(out, [], [".md"]) == []
    text = (out / "writeup.md").read_text()
    fsdp = text[text.index("\n## fsdp_accounting:") :].split("\n## ")[1]
    assert "(a) Memory per rank" in fsdp and "refused (log: logs/fsdp_accounting-yours.log)" in fsdp
    held = next(t for t in parse_tables(fsdp) if t.title == "Bytes each rank holds after a step")
    assert {"single", "fsdp2"} <= {row[0] for row in held.rows}
    assert report_main(["--verify", str(out / "writeup.md"), str(out / run.PLAN_FILE)]) == 0


def test_handout_takes_its_flags_from_a_config_file_and_the_command_line_wins(tmp_path, capsys):
    """--config FILE.json holds handout's flags as a sweep's does; its --timeout limits the imports too."""
    config = tmp_path / "handout.json"
    flags = {"edition": "2025", "scale": "small", "device": "cpu", "problems": ["nope"], "dry_run": True}
    config.write_text(json.dumps(flags))
    assert cli.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "--problems nope: unknown" in err and err.count("\n") == 1, err
    hang = {**flags, "problems": ["benchmarking_script"], "timeout": 1}
    config.write_text(json.dumps({**hang, "model_factory": "tests.fixtures.hostile.hang_at_import:build"}))
    assert cli.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "did not return within --timeout 1 s" in err and err.count("\n") == 1, err
    assert cli.main(["--config", str(config), "--timeout", "2"]) == 2  # the command line wins
    assert "did not return within --timeout 2 s" in capsys.readouterr().err


def test_benchmarking_mixed_precision_without_benchmarking_script_shows_its_bf16_rows_and_verifies(tmp_path):
    """--problems benchmarking_mixed_precision alone: its fp32 rows are benchmarking_script's, not run, so a
    table headed 'fp32 and bf16' held only bf16 rows and the write-up did not verify."""
    import shutil

    from cs336_systems.handout.writeup import write_up
    from cs336_systems.report.cli import main as report_main

    steps = build_steps(Options("2026", SMALL, "cpu"), CPU, ["benchmarking_mixed_precision"])
    out = tmp_path / "out"
    out.mkdir()
    for step in steps:
        for name in step.outputs():
            if (REPO / "writeup" / "2026" / name).is_file():
                shutil.copy(REPO / "writeup" / "2026" / name, out / name)
    outcomes = {step.id: {"outcome": "ok", "exit_status": 0} for step in steps}
    run.write_plan(out / run.PLAN_FILE, run.plan_rows(steps, CPU, out, outcomes, "2026", "small"))
    assert write_up(out, [], [".md"]) == []
    text = (out / "writeup.md").read_text()
    assert "#### bf16 autocast\n" in text and "fp32 and bf16 autocast" not in text
    assert report_main(["--verify", str(out / "writeup.md"), str(out / run.PLAN_FILE)]) == 0


def test_the_plan_says_when_other_processes_keep_this_machine_busy(monkeypatch, capsys):
    """The prediction assumes a machine of its own: a plan made while other processes hold the cores says so
    (busy CPU time here is faked: 1.5 cores of it that are not ours), and a quiet machine's plan does not."""
    from cs336_systems import contention

    argv = ["--device", "cpu", "--scale", "small", "--problems", "benchmarking_script", "--dry-run"]
    monkeypatch.setattr(contention, "_own_seconds", lambda: {})
    start = contention.time.monotonic()
    monkeypatch.setattr(contention.psutil, "cpu_count", lambda: 2)
    monkeypatch.setattr(contention, "_busy_seconds", lambda: 1.5 * (contention.time.monotonic() - start))
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    # 1.5 cores less the kernel's tick rounding (at most 0.08 over the half second the plan waits at least)
    assert re.search(
        r"Other processes keep 1\.[45] of 2 cores busy now: the steps will take longer than predicted", out
    )
    monkeypatch.setattr(contention, "_busy_seconds", lambda: 0.0)
    assert cli.main(argv) == 0
    assert "Other processes keep" not in capsys.readouterr().out
