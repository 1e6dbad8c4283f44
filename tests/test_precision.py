import pytest
import torch

from cs336_systems.precision import _current_flags, autocast, grad_scaler, precision_mode, unsupported_reason

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("precision", "matmul", "tf32", "dtype"),
    [
        ("fp32", "highest", False, None),
        ("tf32", "high", True, None),
        ("bf16", "highest", False, "bfloat16"),
        ("fp16", "highest", False, "float16"),
    ],
)
def test_precision_mode_sets_and_restores_flags(precision, matmul, tf32, dtype):
    before = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    with precision_mode(precision, CPU) as state:
        assert torch.get_float32_matmul_precision() == matmul
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert (state.matmul_precision, state.cuda_matmul_allow_tf32, state.cudnn_allow_tf32) == (matmul, tf32, tf32)
        assert state.autocast_dtype == dtype
        assert state.grad_scaler is (precision == "fp16")
    after = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    assert after == before


def test_flags_restored_after_an_exception():
    before = torch.get_float32_matmul_precision()
    with pytest.raises(RuntimeError), precision_mode("tf32", CPU):
        raise RuntimeError("boom")
    assert torch.get_float32_matmul_precision() == before


def test_autocast_contexts():
    layer = torch.nn.Linear(4, 4)
    with autocast("bf16", CPU):
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast("fp32", CPU):
        assert layer(torch.randn(2, 4)).dtype == torch.float32
    assert grad_scaler("fp16", CPU) is not None and grad_scaler("bf16", CPU) is None


def test_unsupported_combinations():
    assert "TF32" in unsupported_reason("tf32", CPU)
    assert unsupported_reason("fp32", CPU) is None
    assert unsupported_reason("bf16", CPU) is None


def test_old_gpu_cannot_do_bf16_or_tf32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    gpu = torch.device("cuda", 0)
    assert "compute capability 8.0" in unsupported_reason("bf16", gpu)
    assert "compute capability 8.0" in unsupported_reason("tf32", gpu)
    assert unsupported_reason("fp16", gpu) is None


def test_precision_table_is_the_one_description():
    from cs336_systems.flops import table_peak_tflops
    from cs336_systems.precision import PRECISION_TABLE, PRECISIONS, grad_scaler

    assert PRECISIONS == ("fp32", "tf32", "bf16", "fp16")
    for name, mode in PRECISION_TABLE.items():
        with precision_mode(name, torch.device("cpu")) as state:
            assert state.matmul_precision == mode.matmul_precision
            assert state.cudnn_allow_tf32 == mode.tf32
            assert state.grad_scaler == mode.grad_scaler == (grad_scaler(name, torch.device("cpu")) is not None)
            assert state.autocast_dtype == (
                str(mode.autocast_dtype).removeprefix("torch.") if mode.autocast_dtype else None
            )
    # fp16 reads the bf16 column: the same tensor-core peak on these GPUs
    assert table_peak_tflops("NVIDIA H100 80GB HBM3", "fp16") == table_peak_tflops("NVIDIA H100 80GB HBM3", "bf16")


@pytest.fixture
def tf32_flags_restored():
    b = torch.backends
    saved = (b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)
    yield
    torch.set_float32_matmul_precision("highest")
    b.cuda.matmul.allow_tf32 = False
    b.cudnn.allow_tf32 = True
    b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = saved


@pytest.mark.parametrize("precision, expected", [("fp32", ("highest", False, False)), ("tf32", ("high", True, True))])
def test_tf32_flags_after_a_library_used_the_new_fp32_precision_api(tf32_flags_restored, precision, expected):
    # A user's model or a library set the new API: the legacy flags then raise when read.
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    with precision_mode(precision, CPU) as state:
        assert (state.matmul_precision, state.cuda_matmul_allow_tf32, state.cudnn_allow_tf32) == expected
        assert torch.backends.cuda.matmul.fp32_precision == ("tf32" if expected[1] else "ieee")
        assert torch.backends.cudnn.conv.fp32_precision == ("tf32" if expected[2] else "ieee")
        assert torch.get_float32_matmul_precision() == expected[0]  # the legacy read works inside
    # the process's own setting is back, and reading what is in effect does not raise
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert _current_flags() == ("high", True, False)
