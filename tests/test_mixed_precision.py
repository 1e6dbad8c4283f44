"""mixed_precision: the accumulation values and the autocast dtypes, as measured on CPU."""

import pytest
import torch

from cs336_systems import mixed_precision
from cs336_systems.mixed_precision import TENSORS, accumulate, accumulation_experiments, autocast_dtypes, autocast_why


def test_the_four_accumulation_experiments():
    results = {a.experiment: a for a in accumulation_experiments("cpu")}
    fp32, fp16 = results["1. fp32 += fp32"], results["2. fp16 += fp16"]
    mixed, cast = results["3. fp32 += fp16"], results["4. fp32 += fp16 cast to fp32"]
    assert fp32.value == pytest.approx(10.000133514404297, abs=0)  # small rounding drift
    assert fp16.value == 9.953125  # the fp16 accumulator drifts by ~0.05
    assert mixed.value == cast.value == pytest.approx(10.00213623046875, abs=0)  # fp16's 0.01, summed exactly
    assert mixed.value != 10.0 and abs(mixed.error) < abs(fp16.error)
    assert results["(extra) bf16 += bf16"].value == 4.0  # bf16 stalls where 0.01 < half its spacing
    assert all(a.why for a in results.values())


def test_fp32_accumulation_of_fp16_is_1000_times_the_stored_addend():
    stored = float(torch.tensor(0.01, dtype=torch.float16).double())
    assert accumulate(torch.float32, torch.float16) == pytest.approx(1000 * stored, rel=1e-6)


@pytest.mark.parametrize(("dtype", "low"), [(torch.float16, "fp16"), (torch.bfloat16, "bf16")])
def test_autocast_dtypes_on_cpu(dtype, low):
    seen = autocast_dtypes(dtype, "cpu")
    assert seen == {
        "parameters": "fp32",
        "fc1 output": low,
        "ReLU output": low,
        "LayerNorm output": low,  # CPU autocast leaves layer_norm alone (CUDA runs it in fp32)
        "logits (fc2 output)": low,
        "loss": "fp32",
        "gradients": "fp32",
    }


def test_every_tensor_has_a_reason_that_matches_the_device():
    for name in TENSORS:
        assert autocast_why(name, "fp16", "bf16", "cpu")
    assert "leaves layer_norm alone" in autocast_why("LayerNorm output", "fp16", "bf16", "cpu")
    assert "runs layer_norm in fp32" in autocast_why("LayerNorm output", "fp32", "fp32", "cuda")


def test_cli_prints_both_tables(capsys):
    assert mixed_precision.main(["--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "9.953125" in out and "10.00213623046875" in out and "| LayerNorm output" in out


def test_cli_bad_device_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert mixed_precision.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA is not available" in err


def test_cli_writes_the_printed_values_as_rows(tmp_path, capsys):
    import pandas as pd

    csv, jsonl = tmp_path / "mp.csv", tmp_path / "mp.jsonl"
    assert mixed_precision.main(["--device", "cpu", "--output", str(csv), "--output", str(jsonl)]) == 0
    rows = pd.read_csv(csv)
    assert len(rows) == len(pd.read_json(jsonl, lines=True)) == 5 + len(TENSORS)
    accumulation = rows[rows["table"] == "accumulation"].set_index("experiment")
    assert accumulation.loc["2. fp16 += fp16", "result"] == 9.953125
    assert accumulation.loc["2. fp16 += fp16", "error"] == pytest.approx(-0.046875)
    autocast = rows[rows["table"] == "autocast"].set_index("tensor")
    assert autocast.loc["fc1 output", ["fp16", "bf16"]].tolist() == ["fp16", "bf16"]
    assert set(rows["device"]) == {"cpu"} and rows["device_name"].notna().all() and "torch_version" in rows
    assert mixed_precision.main(["--device", "cpu", "--output", str(tmp_path / "mp.md")]) == 2
    assert "writes .csv or .jsonl" in capsys.readouterr().err
