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
