"""The machine a handout plan is for: the one present, or one described by --assume-device.

Planning needs four facts: the device type, its memory, its peak FLOP/s per precision (the spec
table of flops.py for a GPU, a short matmul probe for this CPU) and how many GPUs there are.

Under --executor slurm the steps run on nodes this process is not on: a first job reports the device
there, as this file's command (handout/jobs.py submits it):

    python -m cs336_systems.handout.target --device cuda:0 OUTPUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from ..argtypes import available_memory_bytes
from ..errors import UsageError
from ..flops import PEAK_TFLOPS_TABLE, table_peak_tflops
from ..units import format_bytes, parse_bytes

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(gib|gb|g)\b", re.IGNORECASE)


class TargetError(UsageError):
    """A device description that cannot be planned for (one line, exit 2)."""


@dataclass(frozen=True)
class Target:
    name: str  # as the device reports it, or as --assume-device says it
    type: str  # "cuda" or "cpu"
    memory_bytes: int | None  # what one device can hold (CPU: memory available at start)
    gpus: int  # GPUs present (0 on a CPU)
    assumed: bool  # planned for a device described, not present
    nsys: bool  # Nsight Systems found on PATH
    triton: bool  # Triton importable and a GPU to run it
    cpu_peak_tflops: dict[str, float] | None = None  # measured on this CPU, per precision
    emulated: tuple[str, ...] = ()  # precisions this CPU has no matmul instructions for (far slower)

    def peak_tflops(self, precision: str) -> float | None:
        if self.type == "cpu":
            return (self.cpu_peak_tflops or {}).get(precision)
        return table_peak_tflops(self.name, precision)

    def describe(self) -> str:
        memory = f", {format_bytes(self.memory_bytes)}" if self.memory_bytes else ""
        gpus = f", {self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.type == "cuda" else ""
        return f"{self.name}{memory}{gpus}{' (assumed)' if self.assumed else ''}"

    @property
    def label(self) -> str:
        """The device's name as a directory name: results/handout-2026-<label>/."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or self.type


def known_gpu_names() -> list[str]:
    return [" ".join(words).upper() for words, _, _ in PEAK_TFLOPS_TABLE]


def assumed_target(text: str) -> Target:
    """'H100 80GB', '80GiB A100', '2x H200 141GB': a memory size and a name from the peak table,
    optionally the number of GPUs first."""
    count = re.match(r"\s*(\d+)\s*x\s+", text, re.IGNORECASE)
    gpus = int(count.group(1)) if count else 1
    if gpus < 1:
        raise TargetError(f"--assume-device {text!r}: at least one GPU")
    text = text[count.end() :] if count else text
    match = _SIZE.search(text)
    if match is None:
        raise TargetError(f"--assume-device {text!r}: give the memory size too, e.g. 'H100 80GB'")
    # "80GB" as vendors name a card: 80 GiB of which the driver reports a little less (79.6 on an H100)
    memory = parse_bytes(f"{match.group(1)}GiB")
    name = (text[: match.start()] + text[match.end() :]).strip() or text
    if table_peak_tflops(name, "fp32") is None:
        raise TargetError(
            f"--assume-device {text!r}: {name!r} is not in the peak FLOP/s table "
            f"(known: {', '.join(known_gpu_names())})"
        )
    return Target(name=name, type="cuda", memory_bytes=memory, gpus=gpus, assumed=True, nsys=False, triton=True)


def present_target(device, measure_cpu_peak: bool = True) -> Target:
    """The device --device resolved to; on a CPU its matmul rate is probed (well under a second)."""
    import torch

    from ..flops import measure_peak_tflops
    from ..results import collect_environment

    nsys = shutil.which("nsys") is not None
    name = collect_environment(device).device_name  # as every result row names it
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
        triton = importlib.util.find_spec("triton") is not None
        return Target(name, "cuda", memory, torch.cuda.device_count(), False, nsys, triton)
    from ..precision import cpu_has_native

    peaks = {p: measure_peak_tflops(device, p) for p in ("fp32", "bf16")} if measure_cpu_peak else None
    emulated = tuple(p for p in ("bf16", "fp16") if not cpu_has_native(p))
    return Target(name, "cpu", available_memory_bytes(), 0, False, nsys, False, peaks, emulated)


def target_record(target: Target, environ=os.environ) -> dict:
    """The target as JSON, with where it was found: the host, and Slurm's name of the node (--nodelist's)."""
    return {
        **dataclasses.asdict(target),
        "hostname": socket.gethostname(),
        "slurm_node": environ.get("SLURMD_NODENAME"),
    }


def target_from_record(record: dict) -> Target | None:
    """The Target of a record target_record wrote; None when it is not one (a file cut short, another version)."""
    names = {f.name for f in dataclasses.fields(Target)}
    values = {k: v for k, v in record.items() if k in names}
    try:
        return Target(**{**values, "emulated": tuple(values.get("emulated") or ())})
    except TypeError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336_systems.handout.target", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("output", type=Path)
    args = parser.parse_args(argv)
    from ..device import resolve_device

    record = target_record(present_target(resolve_device(args.device)))
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
