import dataclasses
import json
import os

import pandas as pd
import pytest
import torch

from cs336_systems import benchmark
from cs336_systems.child import ChildLimits, benchmark_arguments
from cs336_systems.config import IDENTITY_FIELDS, MODEL_SHAPE_FIELDS, NOT_IDENTITY, BenchmarkConfig
from cs336_systems.ddp_bench.record import DdpRecord
from cs336_systems.models import ConfigError
from cs336_systems.results import BenchmarkRecord, read_results
from tests.helpers import tiny_benchmark_config, tiny_model_config

row_key = BenchmarkRecord.row_key


def test_identity_is_declared_once_and_is_the_records_first_columns():
    assert BenchmarkRecord.identity_fields() == IDENTITY_FIELDS
    assert BenchmarkRecord.row_fields()[: 1 + len(IDENTITY_FIELDS)] == ("tool", *IDENTITY_FIELDS)
    assert list(tiny_benchmark_config().identity()) == list(IDENTITY_FIELDS)
    # the model-shape columns are one declaration shared by the benchmark and DDP records
    assert set(MODEL_SHAPE_FIELDS) <= set(DdpRecord.identity_fields())
    assert DdpRecord.row_fields()[: 1 + len(MODEL_SHAPE_FIELDS)] == ("tool", *MODEL_SHAPE_FIELDS)


def test_a_model_factory_rows_na_attention_is_one_key_in_every_file(tmp_path):
    # "n/a" is one of pandas' NA strings: CSV reads it back as NaN, JSONL keeps it
    config = tiny_benchmark_config(model_factory="pkg.mod:make")
    record = BenchmarkRecord.for_config(config, torch.device("cpu"), None, None)
    assert record.attention == "n/a" and record.key() == config.key()
    frame = pd.DataFrame([record.to_row()])
    frame.to_csv(tmp_path / "rows.csv", index=False)
    frame.to_json(tmp_path / "rows.jsonl", orient="records", lines=True)
    (csv_row,) = read_results(tmp_path / "rows.csv").to_dict("records")
    (jsonl_row,) = read_results(tmp_path / "rows.jsonl").to_dict("records")
    assert pd.isna(csv_row["attention"]) and jsonl_row["attention"] == "n/a"
    assert row_key(csv_row) == row_key(jsonl_row) == record.key()


def test_key_equals_the_key_of_the_record_row():
    for config in (tiny_benchmark_config(), tiny_benchmark_config(compile=True, compile_scope="blocks")):
        row = BenchmarkRecord.for_config(config, torch.device("cpu"), None, None).to_row()
        assert config.key() == row_key(row)


def test_key_survives_a_file_round_trip(tmp_path):
    for config in (tiny_benchmark_config(), tiny_benchmark_config(model_factory="pkg.mod:make", compile=True)):
        frame = pd.DataFrame([BenchmarkRecord.for_config(config, torch.device("cpu"), None, None).to_row()])
        frame.to_csv(tmp_path / "rows.csv", index=False)
        frame.to_json(tmp_path / "rows.jsonl", orient="records", lines=True)
        for name in ("rows.csv", "rows.jsonl"):
            (row,) = read_results(tmp_path / name).to_dict("records")
            assert row_key(row) == config.key(), name


def test_key_tells_configurations_apart_and_ignores_what_is_not_identity():
    config = tiny_benchmark_config()
    assert config.replace(batch_size=3).key() != config.key()
    assert config.replace(seed=1).key() != config.key()
    # compile_scope only matters when compiling; the MFU denominator is not identity
    assert config.replace(compile_scope="blocks").key() == config.key()
    assert config.replace(peak="measure", peak_tflops=1.0).key() == config.key()


def test_config_is_frozen():
    config = tiny_benchmark_config()
    assert isinstance(config, BenchmarkConfig)
    try:
        config.batch_size = 9
    except dataclasses.FrozenInstanceError:
        return
    raise AssertionError("BenchmarkConfig must be frozen")


# -- a new setting is one field: it reaches the child, the record and the key by itself --------

# A value other than the default for each text setting (numbers and flags are changed by type).
OTHER_TEXT = {
    "pass_type": "train-step",
    "precision": "bf16",
    "compile_scope": "blocks",
    "compile_mode": "max-autotune",
    "device": "cuda:1",
    "timer": "cuda-event",
    "peak": "measure",
    "model_factory": "pkg.mod:make",
    "optimizer_factory": "pkg.mod:sgd",
    "attention": "naive",
    "size_name": "small",
    "size_table": "2026",
    "checkpoint_blocks": "sqrt",
    "param_dtype": "bf16",
}


def _other(field: dataclasses.Field, value: object) -> object:
    if field.name in OTHER_TEXT:
        return OTHER_TEXT[field.name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 if value else 1  # doubled keeps d_model divisible by num_heads
    if value is None and "float" in str(field.type):
        return 2.5
    raise AssertionError(f"give the new field {field.name!r} a non-default value in OTHER_TEXT")


# What a configuration refuses together (its constructor says so): the user's code with the built-in
# model's checkpointing, fused projections or CUDA-graph capture; a CUDA graph with a mode that captures
# graphs itself, micro-batches or bf16 parameters.
BUILT_IN_ONLY = ("cuda_graphs", "fused_projections", "checkpoint_blocks")
USER_CODE = ("model_factory", "optimizer_factory", "compile_mode", "grad_accum_steps", "param_dtype")


def _every_field_changed(user_code: bool) -> BenchmarkConfig:
    """Every setting changed from the default but those that contradict the user's code and the rest of
    USER_CODE (`user_code`), or are USER_CODE (not `user_code`): the two configurations change every
    setting between them."""
    kept = BUILT_IN_ONLY if user_code else USER_CODE
    base = tiny_benchmark_config()
    model = base.model.replace(
        **{f.name: _other(f, getattr(base.model, f.name)) for f in dataclasses.fields(base.model) if f.name not in kept}
    )
    changes = {
        f.name: _other(f, getattr(base, f.name))
        for f in dataclasses.fields(base)
        if f.name != "model" and f.name not in kept
    }
    return base.replace(model=model, **changes)


def test_every_setting_reaches_a_child_process_as_data():
    both = (_every_field_changed(user_code=False), _every_field_changed(user_code=True))
    default = tiny_benchmark_config()
    for field in dataclasses.fields(BenchmarkConfig):
        assert any(getattr(config, field.name) != getattr(default, field.name) for config in both), field.name
    for config in both:
        assert BenchmarkConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
        # what a sweep's child runs: `benchmark --config JSON` (and a file holding it)
        arguments = benchmark_arguments(config, ChildLimits())
        assert arguments[:2] == ["cs336_systems.benchmark", "--config"]
        assert benchmark.config_from_args(benchmark.build_parser().parse_args(arguments[1:])) == config


def test_every_setting_is_identity_or_said_not_to_be_and_every_identity_column_is_recorded():
    for field in dataclasses.fields(BenchmarkConfig):
        assert (field.name in IDENTITY_FIELDS) != (field.name in NOT_IDENTITY), (
            f"{field.name}: add it to BenchmarkIdentity (it changes what is measured) or to NOT_IDENTITY"
        )
    for user_code in (False, True):
        config = _every_field_changed(user_code).replace(pass_type="train-step", compile=True)
        row = BenchmarkRecord.for_config(config, torch.device("cpu"), None, None).to_row()
        assert {name: row[name] for name in IDENTITY_FIELDS} == {**config.identity(), "device": "cpu"}
    for name in set(IDENTITY_FIELDS) - {"model_size", "attention", "optimizer_factory"}:  # these follow others
        # bf16 parameters run under bf16 autocast only (the configuration refuses fp32 with them)
        base = tiny_benchmark_config(compile=True, precision="bf16" if name == "param_dtype" else "fp32")
        owner = base if hasattr(base, name) else base.model
        field = next(f for f in dataclasses.fields(owner) if f.name == name)
        value = 8 if name == "context_length" else _other(field, getattr(owner, name))  # within the model's 16
        changed = (
            base.replace(**{name: value}) if owner is base else base.replace(model=base.model.replace(**{name: value}))
        )
        assert changed.key() != base.key(), name


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"context_length": "8"}, None),  # a number written as text: read as the flag reads it
        ({"context_length": "eight"}, "context_length (as --context-length): expected an integer, got 'eight'"),
        ({"context_length": [8]}, "context_length (as --context-length): expected a single value"),
        ({"context_length": "128"}, "--context-length 128 is longer than the model supports"),  # read, then checked
    ],
)
def test_a_context_length_given_as_text_in_config_is_read_or_refused_as_the_flag(tmp_path, capsys, changes, message):
    data = {**tiny_benchmark_config(measure_steps=2, profile_step=False).to_dict(), **changes}
    code = benchmark.main(["--config", json.dumps(data), "--output", str(tmp_path / "row.jsonl")])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0 and json.loads((tmp_path / "row.jsonl").read_text())["context_length"] == 8, err
    else:
        assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_config_nested_200000_deep_is_one_line(tmp_path, capsys):
    """json decodes by recursion: a RecursionError traceback before, in benchmark's --config and a sweep's."""
    from cs336_systems import run_benchmarks

    deep = tmp_path / "deep.json"
    deep.write_text('{"model": ' + "[" * 200_000 + "]" * 200_000 + "}")
    for main in (benchmark.main, run_benchmarks.main):
        assert main(["--config", str(deep)]) == 2
        err = capsys.readouterr().err
        assert "nested too deep" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("{tmp}/missing.json", "cannot read it"),
        ("{{not json", "not JSON"),
        ('{{"model": {{"d_model": 32}}, "flux": 1}}', "unknown configuration field(s): flux"),
        ('{{"model": {{"d_model": 32}}}}', "incomplete configuration"),
        ('{{"model": {{"d_model": 30, "d_ff": 64, "num_layers": 2, "num_heads": 4}}}}', "not divisible"),
    ],
)
def test_a_bad_config_is_one_line_and_exit_2(tmp_path, capsys, given, message):
    code = benchmark.main(["--config", given.format(tmp=tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_config_file_runs_the_configuration_it_holds(tmp_path, capsys):
    config = tiny_benchmark_config(pass_type="forward", measure_steps=2, profile_step=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    out = tmp_path / "row.jsonl"
    assert benchmark.main(["--config", str(path), "--output", str(out)]) == 0, capsys.readouterr().err
    row = json.loads(out.read_text())
    assert BenchmarkRecord.row_key(row) == config.key() and len(row["step_ms"]) == 2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pass_type": "bogus"}, "pass_type (as --pass-type): invalid choice 'bogus'"),
        ({"grad_accum_steps": 0}, "grad_accum_steps (as --grad-accum-steps): must be a positive integer, got 0"),
        ({"peak_tflops": -1}, "peak_tflops (as --peak-tflops): must be a positive number, got -1"),
        ({"compile": "yes"}, "compile (as --compile): expected true or false, got 'yes'"),
        ({"warmup_steps": 1.5}, "warmup_steps (as --warmup-steps): expected an integer, got '1.5'"),
        ({"model": {"d_model": "wide"}}, "model.d_model (as --d-model): expected an integer, got 'wide'"),
        ({"model": {"checkpoint_blocks": -2}}, "model.checkpoint_blocks (as --checkpoint-blocks)"),
        ({"context_length": 64}, "--context-length 64 is longer than the model supports"),
        ({"cuda_graphs": True, "optimizer_factory": "m:f"}, "--cuda-graphs captures torch's fused AdamW"),
    ],
)
def test_a_config_file_is_checked_as_the_flags_are_before_anything_is_built(tmp_path, capsys, changes, message):
    data = tiny_benchmark_config().to_dict()
    data.update({key: value for key, value in changes.items() if key != "model"})
    data["model"].update(changes.get("model", {}))
    code = benchmark.main(["--config", json.dumps(data)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("python -m cs336_systems.benchmark: error: --config") and err.count("\n") == 1
    assert message in err, err


def test_a_config_that_is_a_fifo_or_has_flags_beside_it_is_refused(tmp_path, capsys):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert benchmark.main(["--config", str(fifo)]) == 2  # not a read that never ends
    assert "not a regular file" in capsys.readouterr().err
    text = json.dumps(tiny_benchmark_config().to_dict())
    for beside, flag in ((["--batch-size", "8"], "--batch-size"), (["--batch", "8"], "--batch-size")):
        assert benchmark.main(["--config", text, *beside]) == 2
        err = capsys.readouterr().err
        assert f"{flag} given beside it would be ignored" in err and err.count("\n") == 1


def test_a_configuration_refuses_itself_wherever_it_is_built():
    with pytest.raises(ConfigError, match="pass_type must be one of"):
        tiny_benchmark_config(pass_type="bogus")
    with pytest.raises(ConfigError, match="grad_accum_steps must be positive"):
        tiny_benchmark_config(grad_accum_steps=0)
    with pytest.raises(ConfigError, match="peak_tflops must be a positive number"):
        tiny_benchmark_config(peak_tflops=float("nan"))
    with pytest.raises(ConfigError, match="d_model must be an integer"):
        tiny_model_config(d_model=32.0)
