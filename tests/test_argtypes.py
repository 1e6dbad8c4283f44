import subprocess
import sys

import pytest

from cs336_systems.argtypes import (
    EXIT_FAILED,
    EXIT_OK,
    ArgumentParser,
    add_device_argument,
    add_memory_limit_argument,
    exit_status,
    resolve_memory_limit,
)


def test_exit_status_rule():
    assert exit_status([]) == EXIT_OK
    assert exit_status(["ok", "oom", "unsupported", "skipped"]) == EXIT_OK
    for failed in ("error", "timeout", "wrong"):
        assert exit_status(["ok", failed, "oom"]) == EXIT_FAILED


def test_argtypes_does_not_import_torch():
    code = "import sys, cs336_systems.argtypes; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def parser(**options) -> ArgumentParser:
    parser = ArgumentParser(prog="tool")
    add_memory_limit_argument(parser, **options)
    add_device_argument(parser)
    return parser


def test_memory_limit_is_typed():
    assert parser().parse_args(["--memory-limit", "1KiB"]).memory_limit == 1024
    assert parser().parse_args([]).memory_limit is None
    assert parser(allow_auto=True).parse_args([]).memory_limit == "auto"
    assert parser(allow_auto=True).parse_args(["--memory-limit", "none"]).memory_limit is None
    assert parser().parse_args([]).device == "auto"


def test_bad_memory_limit_is_one_line_and_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["--memory-limit", "lots"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tool: error: argument --memory-limit") and err.count("\n") == 1
    with pytest.raises(SystemExit):
        parser().parse_args(["--memory-limit", "auto"])  # auto only where the tool supports it


def test_resolve_memory_limit():
    assert resolve_memory_limit(None, "cuda") is None
    assert resolve_memory_limit("auto", "cuda") is None
    assert resolve_memory_limit(2048, "cpu") == 2048
    auto = resolve_memory_limit("auto", "cpu")
    assert auto is None or auto > 0
    with pytest.raises(ValueError, match="cannot be used with CUDA"):
        resolve_memory_limit(2048, "cuda")


@pytest.mark.parametrize(
    "tool", ["benchmark", "benchmark_direct", "run_benchmarks", "find_max", "attention_bench", "ddp_bench"]
)
def test_a_step_count_past_any_measurement_is_refused_in_one_line(tool, capsys):
    """--measure-steps 2**40 passed the integer bound and ran for ever: steps have their own."""
    import importlib

    from cs336_systems.config import BenchmarkConfig
    from cs336_systems.models import ConfigError, ModelConfig

    main = importlib.import_module(f"cs336_systems.{tool}").main
    for flag in ("--measure-steps", "--warmup-steps"):
        with pytest.raises(SystemExit) as exit_info:
            main([flag, "1099511627776"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "must be at most 100,000 steps" in err and err.count("\n") == 1
    with pytest.raises(ConfigError, match="measure_steps must be at most 100,000"):
        BenchmarkConfig(model=ModelConfig(d_model=8, d_ff=8, num_layers=1, num_heads=1), measure_steps=2**40)
