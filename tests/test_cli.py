import subprocess

import pandas as pd
import pytest

from cs336_systems import benchmark
from tests.helpers import PYTHON, child_env, run_main
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
        if name.count(".") != 1 or name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        if isinstance(getattr(module, "main", None), Command) and callable(getattr(module, "build_parser", None)):
            tools.add(name.split(".")[1])
    assert {"run_benchmarks", "benchmark_direct", "benchmark", "handout", "storage"} <= tools
    assert set(discover()) == tools
