"""`python -m cs336_systems.handout`: the plan of both editions for a GPU we do not have, fit and budget
from the predictions, bad input, a real small run into a write-up, and a stopped run that continues."""

from __future__ import annotations

import fcntl
import json
import os

import pandas as pd
import pytest

from cs336_systems.handout import cli, outputs, run
from cs336_systems.handout.parameters import FULL, PROBLEMS, Options
from cs336_systems.handout.plan import fit_budget, parse_duration, total_seconds
from cs336_systems.handout.problems import build_steps
from cs336_systems.handout.target import assumed_target
from cs336_systems.results.paths import lock_path

H100 = "H100 80GB"


def plan_for(edition: str, device: str = H100, **options):
    target = assumed_target(device)
    return build_steps(Options(edition, FULL, "cuda", **options), target, list(PROBLEMS[edition])), target


@pytest.mark.parametrize("edition", ["2025", "2026"])
def test_dry_run_for_an_assumed_h100_covers_every_problem_of_the_edition(edition, capsys):
    assert cli.main(["--edition", edition, "--assume-device", H100]) == 0
    out = capsys.readouterr().out
    assert f"Plan for the {edition} handout, full scale, on H100, 80.00 GiB, 1 GPU (assumed)" in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    for problem in PROBLEMS[edition]:
        assert any(line.startswith(f"| {problem} ") for line in table), problem
    commands = out.split("Commands:")[1]
    assert "python -m cs336_systems.run_benchmarks" in commands and "--device cuda" in commands
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

    def stop_at_the_second_step(step, output_dir):
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
        run, "run_step", lambda step, output_dir: (ran.append(step.id), real_run_step(step, output_dir))[1]
    )
    assert cli.main(argv) == 0
    assert ran == ["pytorch_attention"]  # the finished step is not run again
    assert (out / "mixed_precision_accumulation.txt").read_text() == printed
    rows = pd.read_csv(out / "pytorch_attention.csv")
    assert len(rows) == len(rows.drop_duplicates(["implementation", "head_dim", "context_length"])) == 4
    plan = pd.read_csv(out / run.PLAN_FILE)
    assert set(plan.loc[plan["plan_status"] != "skipped", "outcome"]) == {"ok"}

    writeup = (out / "writeup.md").read_text()
    for heading in ("## Handout plan", "## Mixed-precision accumulation", "## Attention"):
        assert heading in writeup
    assert "nsys_profile" not in writeup  # only the problems asked for
    assert "Small scale" in writeup and "pytorch_attention: naive attention" in writeup
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


@pytest.mark.parametrize("status, retried", [(0, False), (1, False), (2, True), (-9, True)])
def test_a_step_that_crashed_or_was_refused_runs_again_next_time(tmp_path, monkeypatch, status, retried):
    from cs336_systems.handout.plan import Step
    from cs336_systems.handout.target import assumed_target

    step = Step("s", "p", "x", "cs336_systems.attention_bench", {"--output": ["rows.csv"]})

    def run_step(step, output_dir):
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
    monkeypatch.setattr(report_cli, "main", lambda argv: report_status)
    out = tmp_path / "handout"
    return out, [*SMALL_RUN, "--problems", "pytorch_attention", "--output-dir", str(out)]


def test_a_write_up_that_failed_exits_1(tmp_path, monkeypatch, capsys):
    out, argv = _handout_dir(tmp_path, monkeypatch, report_status=1)
    assert cli.main(argv) == 1
    assert "error: the write-up failed (exit 1)" in capsys.readouterr().err


@pytest.mark.parametrize("plant", ["theirs", "link", "logs_link", "markers_file", "marker_dir", "locked"])
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
    }[plant]
    if plant == "theirs":
        (out / "pytorch_attention.csv").write_text("theirs\n")
    elif plant == "link":
        (out / "handout_plan.csv").symlink_to(victim)
    elif plant == "logs_link":
        (out / "logs").symlink_to(tmp_path)
    elif plant == "markers_file":
        (out / ".handout").write_text("")
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


def test_report_opens_with_the_plan_and_shows_printed_output_as_written(tmp_path):
    from cs336_systems.report.cli import main as report_main

    plan = pd.DataFrame(
        [
            dict(
                order=1,
                edition="2026",
                scale="full",
                problem="mixed_precision_accumulation",
                step="mixed_precision_accumulation",
                part="accumulation",
                tool="cs336_systems.mixed_precision",
                plan_status="run",
                outcome="ok",
                reason="",
                reductions="",
                predicted_peak_bytes=None,
                device_memory_bytes=2**30,
                predicted_s=15.0,
                elapsed_s=4.2,
                command="python -m cs336_systems.mixed_precision --device cpu",
                text_output="printed.txt",
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
    (tmp_path / "printed.txt").write_text("| accumulator | result |\n|---|---|\n| fp16 | 9.95 #_*$ |\n")
    outputs = [tmp_path / f"writeup.{ext}" for ext in ("md", "typ", "tex")]
    assert report_main([str(tmp_path / "handout_plan.csv"), *(x for o in outputs for x in ("--output", str(o)))]) == 0
    markdown, typst, latex = (o.read_text() for o in outputs)
    assert markdown.index("## Handout plan") < markdown.index("## Mixed-precision accumulation")
    assert "nsys_profile-small-128: nsys. nsys profiles CUDA kernels: needs a GPU." in markdown
    assert "```text\n| accumulator | result |" in markdown
    assert 'raw("| accumulator | result |\\n|---|---|\\n| fp16 | 9.95 #_*$ |", block: true)' in typst
    assert "\\begin{verbatim}\n| accumulator | result |" in latex


def test_two_assumed_gpus_run_data_parallel_on_nccl_with_the_handouts_shape():
    steps, target = plan_for("2025", "2x H100 80GB")
    by_id = {step.id: step for step in steps}
    assert target.gpus == 2
    ddp = by_id["ddp_bucketed_benchmarking"]
    assert ddp.flags["--backend"] == "nccl" and ddp.flags["--model-size"] == "xl" and not ddp.reductions[:-1]
    assert ddp.flags["--bucket-cap-mb"] == ["1", "10", "100", "1000"]
    nccl = by_id["distributed_communication_single_node-nccl"]
    assert nccl.status == "run" and nccl.flags["--world-sizes"] == [2] and "4 6 dropped" in nccl.reductions[0]
