import re
import shlex
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems import benchmark
from tests.helpers import PYTHON, REPO, child_env, run_main
from tests.tiny import TINY


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-size", "huge"], "unknown model size 'huge'"),
        (["--batch-size", "0"], "must be a positive integer"),
        (["--context-length", "-5"], "must be a positive integer"),
        (["--warmup-steps", "-1"], "must be zero or more"),
        (["--measure-steps", "x"], "expected an integer"),
        (["--precision", "fp8"], "invalid choice"),
        (["--context-length", "64", "--max-context-length", "32"], "longer than the model supports"),
        (["--num-heads", "7"], "not divisible"),
        (["--output", "out.xlsx"], "unknown suffix"),
        (["--model-factory", "nonexistent_pkg_xyz:make"], "cannot import 'nonexistent_pkg_xyz'"),
        (["--device", "tpu"], "unknown device 'tpu': use auto, cpu, cuda or cuda:N"),
        (["--device", "meta"], "unknown device 'meta'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run_main(benchmark.main, capsys, *args)
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert err.startswith("python -m cs336_systems.benchmark: error:")


def test_cuda_without_cuda_exits_2(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    code, _, err = run_main(benchmark.main, capsys, "--device", "cuda")
    assert code == 2 and "CUDA is not available" in err
    code, _, err = run_main(benchmark.main, capsys, "--device", "cpu", "--timer", "cuda-event")
    assert code == 2 and "cuda-event needs a CUDA device" in err


def test_list_sizes_prints_exact_counts(capsys):
    code, out, _ = run_main(benchmark.main, capsys, "--list-sizes", "--size-table", "2025")
    assert code == 0
    for count in ("128625408", "423183360", "969411840", "1998235200", "3406809600"):
        assert count in out
    code, out, _ = run_main(benchmark.main, capsys, "--list-sizes")  # no student repository here: the newest
    assert code == 0 and "| 2026 " in out and "12832823808" in out and "1998235200" not in out


def test_run_prints_table_and_writes_every_format(capsys, tmp_path):
    outputs = [tmp_path / "r.csv", tmp_path / "r.md", tmp_path / "r.jsonl"]
    code, out, err = run_main(benchmark.main, capsys, *TINY, *sum((["--output", str(p)] for p in outputs), []))
    assert code == 0, err
    assert out.startswith("# cs336-bench benchmark results") and "| custom " in out
    assert all(p.exists() for p in outputs)
    frame = pd.read_csv(outputs[0])
    assert frame.loc[0, "status"] == "ok" and frame.loc[0, "d_model"] == 32


def test_wrong_user_model_output_is_one_line(capsys, tmp_path, fixtures_on_path):
    code, out, err = run_main(benchmark.main, capsys, *TINY, "--model-factory", "user_models:wrong_shape")
    # refused before the run starts (its model dry-built), as a bad flag is
    assert code == 2 and err.count("\n") == 1 and "expected floating (B, T, V)" in err and "Traceback" not in err


def test_module_entry_point_in_a_child_process(tmp_path):
    result = subprocess.run(
        [PYTHON, "-m", "cs336_systems.benchmark", "--model-size", "nope"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "python -m cs336_systems.benchmark: error: unknown model size 'nope'; "
        "choose one of: small, medium, large, xl, 10B; size table 2026 (the newest edition's; --size-table 2025 "
        "for the other)"
    )


def test_the_dispatcher_runs_every_tool_module():
    """Every module that is a tool (build_parser and run, on the one command spine) is a
    `cs336-bench TOOL`, the sweeps whose parser and run are made for them included."""
    import importlib
    import pkgutil

    import cs336_systems
    from cs336_systems.command import Command
    from cs336_systems.tools import discover

    tools = set()
    for info in pkgutil.walk_packages(cs336_systems.__path__, "cs336_systems."):
        name = info.name.removesuffix(".cli")
        if name.count(".") > 2 or name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        if isinstance(getattr(module, "main", None), Command) and callable(getattr(module, "build_parser", None)):
            tools.add(name.split(".", 1)[1])  # a tool package's own command-line tools too: memory.timeline
    assert {"run_benchmarks", "benchmark_direct", "benchmark", "handout", "storage", "memory.timeline"} <= tools
    assert set(discover()) == tools


def _parser_of(tool: str):
    import importlib

    module = importlib.import_module(f"cs336_systems.{tool}")
    command = getattr(module, "main", None) or importlib.import_module(f"cs336_systems.{tool}.cli").main
    return command.build_parser()


def test_every_command_the_plan_prints_runs_as_printed(capsys):
    """The handout's dry run prints each step as a student would type it: each names a tool the console
    command knows (memory.timeline included) or a script that exists, with flags its parser accepts."""
    from cs336_systems.handout import cli as handout_cli
    from cs336_systems.tools import discover

    assert handout_cli.main(["--edition", "2026", "--dry-run", "--assume-device", "H100 80GB"]) == 0
    lines = capsys.readouterr().out.split("Commands:")[1].strip().splitlines()
    tools = {}
    for line in lines:
        words = shlex.split(line.split(" > ")[0])
        if words[0] == "bash":  # a script around benchmark (nsys): its flags are benchmark's
            assert Path(words[1]).is_file(), line
            tool, args = "benchmark", words[3:]
        else:
            assert words[0] == "cs336-bench" and words[1] in discover(), line
            tool, args = words[1], words[2:]
        tools[tool] = _parser_of(tool).parse_args(args)  # argparse exits on anything it cannot read
    assert {"memory.timeline", "run_benchmarks", "ddp_bench", "attention_bench"} <= set(tools)


def test_every_command_the_docs_and_help_texts_print_names_a_tool_and_its_flags():
    """`cs336-bench TOOL --flag ...` in the README, the manual and each tool's --help: the tool is one the
    console command runs and each flag is the tool's (placeholders such as TOOL and values are not read)."""
    from cs336_systems.sweep import resume_command
    from cs336_systems.tools import COMMAND, discover

    texts = {path.name: path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
    texts |= {f"{tool} --help": _parser_of(tool).format_help() for tool in discover()}
    texts["a sweep's resume hint"] = resume_command(f"{COMMAND} run_benchmarks", ["--model-sizes", "small"])
    seen = set()
    for where, text in texts.items():
        for match in re.finditer(r"cs336-bench ([a-z][\w.]*)([^`\n|;&>]*)", text):
            tool, words = match[1], match[2].split(" -- ")[0].split()
            assert tool in discover(), f"{where}: {match[0]}"
            options = {option for action in _parser_of(tool)._actions for option in action.option_strings}
            for flag in (word.split("=")[0].rstrip(".,:)") for word in words if word.startswith("--")):
                assert flag in options, f"{where}: {match[0]}"
            seen.add(tool)
    assert {"benchmark", "handout", "memory", "run_benchmarks"} <= seen


def test_the_console_command_runs_a_tool_inside_a_tool_package():
    result = subprocess.run(
        [PYTHON, "-m", "cs336_bench", "memory.timeline", "--help"], capture_output=True, text=True, env=child_env()
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: cs336-bench memory.timeline"), result.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["benchmrk"], "unknown tool 'benchmrk'; did you mean 'benchmark'?"),
        (["--model-sise", "small"], "--model-sise small; did you mean --model-size?"),
        (["--context-lengths", "128"], "did you mean --context-length? (a list is a sweep's: cs336-bench"),
        (["--dry-run"], "without running it: cs336-bench memory)"),
        (["--pass-type", "forward-backwards"], "did you mean 'forward-backward'?"),
    ],
)
def test_a_mistyped_tool_flag_or_choice_is_answered_with_the_right_name(capsys, argv, said):
    from cs336_systems.tools import main

    code, _, err = run_main(main if argv[0] == "benchmrk" else benchmark.main, capsys, *argv)
    assert code == 2
    assert said in err and err.count("\n") == 1, err


def test_help_shows_each_flags_default_and_the_tool_as_the_console_command_names_it(capsys):
    parser = _parser_of("benchmark")
    help_text = " ".join(parser.format_help().split())  # argparse wraps lines
    for flag, default in [("--context-length", 512), ("--batch-size", 4), ("--pass-type", "forward-backward")]:
        assert re.search(rf"{flag} \S+ \(default: {default}\)", help_text), flag
    for flag, default in [("--precision", "fp32"), ("--warmup-steps", 5), ("--measure-steps", 10)]:
        assert re.search(rf"{flag} \S+ \(default: {default}\)", help_text), flag
    assert "(default: True)" not in help_text and "(default: None)" not in help_text  # a switch, no default
    # as run (`cs336-bench benchmark` under the console command), whatever the docstring calls it
    assert parser.description.startswith(f"{parser.prog}: time one configuration")
