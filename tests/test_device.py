import pytest
import torch

from cs336_systems.device import DeviceError, failure_status, first_line, is_out_of_memory, resolve_device


def test_failure_status_tells_oom_from_error():
    assert failure_status(torch.OutOfMemoryError("CUDA out of memory. Tried 2 GiB\nmore")) == (
        "oom",
        "CUDA out of memory. Tried 2 GiB",
    )
    assert failure_status(RuntimeError("DefaultCPUAllocator: can't allocate memory: 8 bytes")) == (
        "oom",
        "DefaultCPUAllocator: can't allocate memory: 8 bytes",
    )
    assert failure_status(KeyError("surprise")) == ("error", "KeyError: 'surprise'")
    assert failure_status(ValueError("")) == ("error", "ValueError: ValueError")


def test_out_of_memory_markers_only_on_runtime_errors():
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(ValueError("out of memory"))
    assert first_line(RuntimeError("a\nb")) == "a"


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_a_device_error():
    with pytest.raises(DeviceError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_releasing_memory_after_a_device_side_assert_keeps_the_row(monkeypatch):
    """A lost CUDA context raises its error again at every call, empty_cache included: the failed
    row (which holds the first error) must survive the clean-up (seen on an H200)."""
    from cs336_systems import device as device_module

    def lost_context():
        raise torch.AcceleratorError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(device_module.torch.cuda, "empty_cache", lost_context)
    device_module.release_memory(torch.device("cuda"))  # no raise


def test_a_header_only_first_line_keeps_the_reason():
    """Triton's CompilationError starts 'at LINE:COL:', then the source, then the reason: a row that
    kept only 'at 123:16:' told the student nothing (seen with a public solution's bf16 kernel)."""
    CompilationError = type("CompilationError", (Exception,), {})  # noqa: N806  (triton.compiler.errors' name)
    exc = CompilationError(
        "at 123:16:\n        O_acc = tl.dot(P, V, acc=O_acc)\n                ^\nBoth operands must be same dtype"
    )
    assert failure_status(exc) == (
        "error",
        "CompilationError: at 123:16: ... Both operands must be same dtype",
    )
