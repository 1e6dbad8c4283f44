"""The environment once: one column per device, versions exactly as torch reported them."""

from __future__ import annotations

import pandas as pd

from .document import Section, Table, missing

ROWS = (
    "device_name",
    "cpu_name",
    "device_memory",
    "torch_version",
    "cuda_version",
    "cudnn_version",
    "python_version",
    "platform",
    "matmul_precision",
    "cuda_matmul_allow_tf32",
    "cudnn_allow_tf32",
    "num_threads",
    "git_commit",
)


def _text(name: str, value: object) -> str:
    if missing(value) or value == "":
        return ""
    if name == "device_memory_bytes":
        return f"{float(value) / 2**30:.1f} GiB"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # thread counts; versions are text already (load.py)
    return str(value)


def environment_section(frames: list[pd.DataFrame]) -> Section | None:
    with_device = [f for f in frames if "device_name" in f.columns]
    rows = pd.concat(with_device, ignore_index=True) if with_device else None  # warmup_study has none
    if rows is None or rows.empty:
        return None
    columns: dict[str, dict[str, str]] = {}
    for device, group in rows.groupby("device_name", sort=False):
        cells = {}
        for name in ROWS:
            column = "device_memory_bytes" if name == "device_memory" else name
            if column in group:
                values = dict.fromkeys(t for t in (_text(column, v) for v in group[column]) if t)
                cells[name] = ", ".join(values)  # several commits or versions: all of them, none hidden
        columns[str(device)] = cells
    body = pd.DataFrame(columns).fillna("")
    body = body[body.apply(lambda r: r.ne("").any(), axis=1)]
    body.index.name = "field"
    table = Table("environment", "Environment", "One column per device found in the results.", body)
    return Section("Environment", None, [], [table])
