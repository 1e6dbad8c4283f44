"""A student's repository as it is (tests/fixtures/student_repo): their own package named
cs336_systems (with distributed/ and a benchmark.py of its own), cs336_basics beside it, and
tests/adapters.py importing both. Every run goes through `cs336-bench` (python -m cs336_bench, what
the console script calls) from the fixture's root with the fixture first on the path, as an
installed student package would be; the ddp_bench runs check the spawned ranks too."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from cs336_systems.attention_bench import AttentionConfig
from cs336_systems.attention_bench.implementations import heads_in_batch
from cs336_systems.attention_bench.measure import run_attention
from cs336_systems.ddp_bench.accounting import measured_sharding
from cs336_systems.ddp_bench.trainer import optimizer_class
from cs336_systems.factory import build_model, count_parameters_for, factory_kwargs
from cs336_systems.loading import repo_paths
from cs336_systems.optimizer import OPTIMIZER_KWARGS, OptimizerFactoryError, check_user_optimizer, load_user_optimizer
from cs336_systems.tools import discover
from cs336_systems.user_model import FACTORY_KEYWORDS, FACTORY_SYNONYMS, ModelFactoryError, factory_keywords
from tests.helpers import FIXTURES, REPO, tiny_model_config
from tests.tiny import STEPS, TINY_BATCH, TINY_CPU, TINY_DDP, TINY_SHAPE

STUDENT = FIXTURES / "student_repo"


def run(*args: str, cwd: Path = STUDENT, module: str = "cs336_bench", timeout: int = 300):
    """`cs336-bench ARGS` (or python -m MODULE ARGS) in a child, the student's root before ours."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STUDENT), str(REPO)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_the_tools_and_no_tool_or_an_unknown_one_is_one_line_and_exit_2():
    shown = run("--help")
    assert shown.returncode == 0
    assert "benchmark " in shown.stdout and "ddp_bench " in shown.stdout and "attention_bench " in shown.stdout
    assert "memory_cap" not in shown.stdout and "tools " not in shown.stdout  # modules that are no Command
    unknown = run("no_such_tool")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1
    assert "unknown tool 'no_such_tool'" in unknown.stderr
    none = run()  # no tool: bad input, one line
    assert none.returncode == 2 and len(none.stderr.strip().splitlines()) == 1 and not none.stdout
    assert "name a tool" in none.stderr
    assert "storage " in shown.stdout  # every tool is listed, and runs by name (the README shows storage serve)
    serve = run("storage", "serve", "--help")
    assert serve.returncode == 0 and "--root" in serve.stdout, serve.stderr


def test_tools_are_found_on_disk_with_their_first_docstring_line(tmp_path):
    (tmp_path / "handout").mkdir()
    (tmp_path / "handout" / "__init__.py").write_text('"""python -m cs336_systems.handout: the handout\'s runs."""\n')
    (tmp_path / "handout" / "__main__.py").write_text("")
    (tmp_path / "helper.py").write_text('"""not a tool: no Command"""\nif __name__ == "__main__":\n    pass\n')
    (tmp_path / "tool.py").write_text(
        '"""python -m cs336_systems.tool: does a thing."""\nmain = Command(build_parser, run)\n'
        'if __name__ == "__main__":\n    main.start()\n'
    )
    assert discover(tmp_path) == {"handout": "the handout's runs.", "tool": "does a thing."}


def test_benchmark_runs_ours_with_the_students_optimizer(tmp_path):
    # python -m finds the student's package first: their own benchmark.py runs (the reason for cs336-bench)
    theirs = run("--help", module="cs336_systems.benchmark")
    assert theirs.returncode == 3 and "the student's cs336_systems.benchmark ran" in theirs.stderr
    out = tmp_path / "row.jsonl"
    ours = run(
        "benchmark",
        *TINY_CPU,
        *TINY_SHAPE,
        *TINY_BATCH,
        *STEPS,
        "--pass-type",
        "train-step",
        "--optimizer",
        "cs336_systems.optimizer:AdamW",  # every hyperparameter required
        "--model-factory",
        "cs336_basics.model:TransformerLM",  # device and dtype required
        "--output",
        str(out),
    )
    assert ours.returncode == 0, ours.stderr
    row = json.loads(out.read_text().splitlines()[0])
    assert row["status"] == "ok" and row["optimizer"] == "cs336_systems.optimizer.AdamW"  # theirs, not torch's


def test_a_module_of_the_students_named_like_a_library_of_ours_does_not_replace_it(tmp_path):
    """A tabulate.py in the repository root (first on the path) was imported for ours: the row was lost."""
    (tmp_path / "tabulate.py").write_text("raise ImportError('the student tabulate, not the library')\n")
    out = tmp_path / "rows.md"
    result = run("benchmark", *TINY_CPU, *TINY_SHAPE, *TINY_BATCH, *STEPS, "--output", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| model_size" in out.read_text()


def test_children_start_under_the_running_package_name():
    probe = "from cs336_bench.tools import module_name; import cs336_bench.child as c; print(module_name('benchmark'), c.__name__)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=STUDENT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(STUDENT), str(REPO)])},
    )
    assert result.stdout.split() == ["cs336_bench.benchmark", "cs336_bench.child"], result.stderr


def test_usage_and_errors_name_the_command_the_user_typed():
    # from a student's root, `python -m cs336_systems.benchmark` would run theirs: say `cs336-bench benchmark`
    bad = run("benchmark", "--model-size", "nope")
    assert bad.returncode == 2 and bad.stderr.startswith("cs336-bench benchmark: error: unknown model size")
    assert run("handout", "--help").stdout.startswith("usage: cs336-bench handout")


def test_scripts_and_the_probe_import_ours_beside_the_students_package():
    # scripts run by path (from the student's root) and the probe
    # imported in the student's own loop get our files; the student's imports still get theirs
    check = (
        "import runpy, sys; from pathlib import Path\n"
        "scripts = sorted([*Path(sys.argv[1]).glob('*.py'), *Path(sys.argv[1]).glob('checks/*.py')])\n"
        "for script in scripts: runpy.run_path(str(script), run_name='imported')\n"
        "from cs336_bench.probe import StepProbe\n"
        "from cs336_systems.optimizer import AdamW\n"
        "print(len(scripts), StepProbe.__module__, AdamW.__module__, sys.modules['cs336_systems'].__file__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check, str(REPO / "scripts")],
        cwd=STUDENT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(STUDENT), str(REPO)])},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    count, probe, optimizer, theirs = result.stdout.split()
    assert int(count) >= 10 and probe.startswith("cs336_bench.probe") and optimizer == "cs336_systems.optimizer"
    assert Path(theirs).resolve() == STUDENT / "cs336_systems" / "__init__.py"


def test_attention_bench_defaults_pass_a_3d_flash_that_ignores_is_causal(tmp_path):
    out = tmp_path / "attention.csv"
    result = run(
        "attention_bench",
        "--adapters",
        "tests/adapters.py",
        "--device",
        "cpu",
        "--head-dims",
        "8",
        "--context-lengths",
        "32",
        "--batch-size",
        "2",
        "--num-heads",
        "2",
        "--precisions",
        "fp32",
        "--warmup-steps",
        "0",
        "--measure-steps",
        "1",
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(out).set_index("implementation")
    flash = rows.loc["flash-pytorch"]
    assert flash["status"] == "ok" and flash["causal"] and flash["layout"] == "bhsd"
    assert "with is_causal=True its forward ignores it and its backward ignores it" in flash["notes"]
    assert rows.loc["flash-triton", "status"] == "unsupported"  # Triton needs CUDA; not an error


def test_adapters_from_outside_the_repo_find_their_repo_root_packages(tmp_path):
    # from elsewhere, the loader puts the adapters' repository root on the path, as pytest would
    result = run(
        "attention_bench",
        "--adapters",
        str(STUDENT / "tests" / "adapters.py"),
        "--implementations",
        "flash-pytorch",
        "--device",
        "cpu",
        "--head-dims",
        "8",
        "--context-lengths",
        "16",
        "--warmup-steps",
        "0",
        "--measure-steps",
        "1",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # python -m cs336_systems.X from elsewhere: their `cs336_systems.distributed.ddp` is looked up in ours
    ours_only = {**os.environ, "PYTHONPATH": str(REPO)}
    ours = subprocess.run(
        [
            sys.executable,
            "-m",
            "cs336_systems.attention_bench",
            "--adapters",
            str(STUDENT / "tests" / "adapters.py"),
            "--device",
            "cpu",
        ],
        cwd=tmp_path,
        env=ours_only,
        capture_output=True,
        text=True,
    )
    assert ours.returncode == 2 and len(ours.stderr.strip().splitlines()) == 1, ours.stderr
    assert "cs336-bench" in ours.stderr and "cs336_systems.distributed.ddp" in ours.stderr


def test_repo_paths_are_pytests_for_a_tests_package():
    assert repo_paths(STUDENT / "tests" / "adapters.py") == [STUDENT]
    assert repo_paths(FIXTURES / "adapters_student.py")[-1] == FIXTURES  # a plain file: its own directory


@pytest.mark.slow
def test_ddp_bench_runs_the_students_ddp_fsdp_and_optimizer_in_spawned_ranks(tmp_path):
    out = tmp_path / "ddp.csv"
    result = run(
        "ddp_bench",
        "--device",
        "cpu",
        "--world-sizes",
        "2",
        "--adapters",
        "tests/adapters.py",
        "--strategies",
        "adapter-ddp",
        "adapter-fsdp",
        "adapter-sharded-optimizer",
        "--optimizer",
        "cs336_systems.optimizer:AdamW",
        *TINY_DDP,
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(out).set_index("strategy")
    assert rows.loc["adapter-ddp", "status"] == "ok" and rows.loc["adapter-ddp", "check_max_diff"] == 0
    assert (rows["optimizer"] == "cs336_systems.optimizer:AdamW").all()
    fsdp = rows.loc["adapter-fsdp"]
    # their FSDP shards only cs336_basics' Linear: on the built-in model (nn.Linear) nothing
    assert (
        fsdp["status"] == "not-sharded" and fsdp["param_bytes_per_rank"] == rows.loc["single", "param_bytes_per_rank"]
    )
    assert (
        "nothing sharded" in fsdp["notes"] and "--model-factory cs336_basics.model:BasicsTransformerLM" in fsdp["notes"]
    )
    assert rows.loc["adapter-sharded-optimizer", "status"] == "skipped"


@pytest.mark.slow
def test_ddp_bench_other_edition_is_skipped_once_and_the_handout_model_is_sharded(tmp_path):
    out = tmp_path / "ddp.csv"
    result = run(
        "ddp_bench",
        "--device",
        "cpu",
        "--world-sizes",
        "1",
        "2",
        "--adapters",
        "tests/adapters_2025.py",
        "--strategies",
        "adapter-ddp",
        "adapter-fsdp",
        "--model-factory",
        "cs336_basics.model:BasicsTransformerLM",
        *TINY_DDP,
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(out)
    fsdp = rows[rows["strategy"] == "adapter-fsdp"]
    assert len(fsdp) == 1 and fsdp["status"].item() == "skipped" and "defines no get_fsdp" in fsdp["error"].item()
    assert (rows[rows["strategy"] == "adapter-ddp"]["status"] == "ok").all()  # their model says `theta`
    sharded = tmp_path / "fsdp.csv"
    result = run(
        "ddp_bench",
        "--device",
        "cpu",
        "--world-sizes",
        "2",
        "--adapters",
        "tests/adapters.py",
        "--strategies",
        "adapter-fsdp",
        "--fsdp-compute-dtype",
        "bf16",
        "--model-factory",
        "cs336_basics.model:BasicsTransformerLM",
        *TINY_DDP,
        "--output",
        str(sharded),
    )
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(sharded).set_index("strategy")
    assert rows.loc["adapter-fsdp", "status"] == "ok" and rows.loc["adapter-fsdp", "compute_dtype"] == "bf16"
    assert rows.loc["adapter-fsdp", "param_bytes_per_rank"] < rows.loc["single", "param_bytes_per_rank"]


def test_factory_keywords_follow_the_signature_with_theta_as_rope_theta():
    given = dict(vocab_size=10, d_model=4, rope_theta=10000.0)

    def theta_model(vocab_size, d_model, theta, dropout=0.0):
        pass

    assert factory_keywords(theta_model, given, "m:f") == {"vocab_size": 10, "d_model": 4, "theta": 10000.0}
    assert factory_keywords(lambda **kw: None, given, "m:f") == given
    assert FACTORY_SYNONYMS["theta"] == "rope_theta"
    assert tuple(factory_kwargs(tiny_model_config())) == FACTORY_KEYWORDS  # checked at load by these names

    def needs_more(vocab_size, n_embd):
        pass

    with pytest.raises(ModelFactoryError, match=r"^--model-factory m:f: cannot fill its parameter 'n_embd'"):
        factory_keywords(needs_more, given, "m:f")


class RequiredAdamW(torch.optim.AdamW):
    """An assignment-1 AdamW: every hyperparameter required."""

    def __init__(self, params, lr, weight_decay, betas, eps):
        super().__init__(params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)


def lr_only(params, lr):
    return torch.optim.SGD(params, lr=lr)


def needs_momentum(params, lr, momentum):
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def fails_to_build(params, **kwargs):
    raise ValueError("Invalid learning rate")


def test_a_users_optimizer_is_built_one_way_with_the_hyperparameters_it_takes():
    required = check_user_optimizer("tests.test_student_repo:RequiredAdamW")
    assert required.make is RequiredAdamW and required.keywords == OPTIMIZER_KWARGS  # a class stays a class
    lr = load_user_optimizer("tests.test_student_repo:lr_only")
    assert lr.keywords == {"lr": OPTIMIZER_KWARGS["lr"]}
    assert lr([torch.nn.Parameter(torch.zeros(1))], lr=0.5, eps=1.0).defaults["lr"] == 0.5  # ddp_bench's scaled lr
    # ddp_bench hands the class and its keywords to strategies (a student's sharded optimizer among them)
    cls, kwargs = optimizer_class("tests.test_student_repo:RequiredAdamW", torch.device("cpu"), lr=0.25)
    assert cls is RequiredAdamW and kwargs == {**OPTIMIZER_KWARGS, "lr": 0.25}
    with pytest.raises(
        OptimizerFactoryError, match=r"^--optimizer \S+needs_momentum: cannot fill its parameter 'momentum'"
    ):
        check_user_optimizer("tests.test_student_repo:needs_momentum")
    with pytest.raises(OptimizerFactoryError, match=r"fails_to_build raised ValueError: Invalid learning rate$"):
        check_user_optimizer("tests.test_student_repo:fails_to_build")  # before any model, rank or worker


def assignment1_model(vocab_size, d_model, device, dtype):
    model = torch.nn.Sequential(torch.nn.Embedding(vocab_size, d_model, device=device, dtype=dtype))
    model.given = (device, dtype)
    return model


def test_a_factory_that_requires_device_and_dtype_gets_the_runs():
    config = tiny_model_config()
    model = build_model(config, "cpu", "tests.test_student_repo:assignment1_model")
    assert model.given == (torch.device("cpu"), torch.float32)
    assert count_parameters_for(config, "tests.test_student_repo:assignment1_model") == 97 * 32  # built on meta

    def needs_more(vocab_size, device, dtype, n_embd):
        pass

    with pytest.raises(ModelFactoryError, match=r"cannot fill its parameter 'n_embd'; it is given .*device, dtype"):
        factory_keywords(needs_more, dict.fromkeys((*FACTORY_KEYWORDS, "device", "dtype")), "m:f")


def test_heads_are_folded_into_the_batch_for_adapters():
    shapes = []

    def three_d_only(q, k, v):
        batch, seq, d = q.shape
        shapes.append(tuple(q.shape))
        return q + v

    q = torch.randn(2, 3, 5, 4)
    out = heads_in_batch(three_d_only)(q, q, q)
    assert shapes == [(6, 5, 4)] and out.shape == q.shape and torch.equal(out, 2 * q)


def test_a_flash_forward_that_ignores_is_causal_and_a_backward_that_applies_it_is_judged_as_its_test_judges():
    adapters = str(FIXTURES / "adapters_causal_backward.py")
    config = AttentionConfig("flash-pytorch", head_dim=8, context_length=16, warmup_steps=1, measure_steps=2)
    record = run_attention(dataclasses.replace(config, adapters=adapters))
    assert record.status == "ok", record.error
    said = "with is_causal=True its forward ignores it and its backward matches neither"
    assert said in record.notes and "checked and timed with is_causal=False" in record.notes
    assert record.max_abs_err_out < 1e-4 and record.forward_median_ms > 0  # checked and timed non-causal


def test_a_triton_flash_that_ignores_is_causal_is_wrong_saying_what_it_does():
    from cs336_systems.attention_bench.correctness import check, judge_causal, reference

    config = AttentionConfig(implementation="flash-triton", head_dim=4, context_length=8, adapters="a.py")
    q, k, v, grad_out = (torch.randn(1, 8, 4, requires_grad=i < 3) for i in range(4))
    out = torch.softmax(q @ k.transpose(-1, -2) / 2, dim=-1) @ v  # non-causal attention, forward and backward
    out.backward(grad_out)
    expected_out, expected_grads = reference(q, k, v, grad_out, True)
    causal = check(out, (q.grad, k.grad, v.grad), expected_out, expected_grads, "fp32")
    verdict = judge_causal(config, (q, k, v, grad_out), out.detach(), causal, None)
    assert not verdict.noncausal
    assert verdict.wrong.startswith("with is_causal=True its forward ignores it and its backward ignores it: differs")


def test_measured_sharding_believes_bytes_not_declarations():
    declared = (True, True, True)
    assert measured_sharding("adapter-fsdp", 100, 100, 100, declared) == (False, False, False)
    assert measured_sharding("adapter-fsdp", 100, 60, 60, declared) == (True, True, True)
    assert measured_sharding("adapter-sharded-optimizer", 100, 100, 50, (False, False, True)) == (False, False, True)
    assert measured_sharding("adapter-sharded-optimizer", 100, 100, 100, (False, False, True)) == (False, False, False)
    assert measured_sharding("fsdp2", 100, 100, 100, declared) == declared


def test_after_cs336_bench_a_students_cs336_systems_wins_even_behind_ours_on_the_path(tmp_path):
    probe = "import cs336_bench, cs336_systems; print(cs336_systems.__file__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(STUDENT)])}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert Path(result.stdout.strip()) == STUDENT / "cs336_systems" / "__init__.py", result.stderr
    # with no student package, `cs336_systems` still imports (ours, or another copy installed)
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0 and STUDENT not in Path(result.stdout.strip()).parents, result.stderr
