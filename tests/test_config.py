import dataclasses

import pandas as pd
import torch

from cs336_systems.config import IDENTITY_FIELDS, MODEL_SHAPE_FIELDS, BenchmarkConfig
from cs336_systems.ddp_bench.record import DdpRecord
from cs336_systems.results import BenchmarkRecord, read_results
from cs336_systems.runner import new_record
from tests.conftest import tiny_benchmark_config

row_key = BenchmarkRecord.row_key


def test_identity_is_declared_once_and_is_the_records_first_columns():
    assert BenchmarkRecord.identity_fields() == IDENTITY_FIELDS
    assert BenchmarkRecord.row_fields()[: len(IDENTITY_FIELDS)] == IDENTITY_FIELDS
    assert list(tiny_benchmark_config().identity()) == list(IDENTITY_FIELDS)
    # the model-shape columns are one declaration shared by the benchmark and DDP records
    assert set(MODEL_SHAPE_FIELDS) <= set(DdpRecord.identity_fields())
    assert DdpRecord.row_fields()[: len(MODEL_SHAPE_FIELDS)] == MODEL_SHAPE_FIELDS


def test_a_model_factory_rows_na_attention_is_one_key_in_every_file(tmp_path):
    # "n/a" is one of pandas' NA strings: CSV reads it back as NaN, JSONL keeps it
    config = tiny_benchmark_config(model_factory="pkg.mod:make")
    record = new_record(config, torch.device("cpu"), None, None)
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
        row = new_record(config, torch.device("cpu"), None, None).to_row()
        assert config.key() == row_key(row)


def test_key_survives_a_file_round_trip(tmp_path):
    for config in (tiny_benchmark_config(), tiny_benchmark_config(model_factory="pkg.mod:make", compile=True)):
        frame = pd.DataFrame([new_record(config, torch.device("cpu"), None, None).to_row()])
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
