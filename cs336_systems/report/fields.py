"""What tells two result rows apart, and how a report names it: each tool's identity fields (from
its record's declaration), the derived `model` label, and the text a label cell shows. The table
builder (grid.py) and `report --verify` both read rows through here, so they cannot disagree."""

from __future__ import annotations

import math

import pandas as pd

from ..config import MODEL_SHAPE_FIELDS
from ..models import SIZE_TABLES
from ..results.origin import ROW_IDENTITY
from .document import missing, plain

# A model is named by one label; these are the identity fields it replaces (attention stays its own).
MODEL_FIELDS = tuple(name for name in MODEL_SHAPE_FIELDS if name != "attention")


def _identity(record: type, *more: str) -> tuple[str, ...]:
    """The record's identity fields, a model's shape fields named by one `model` label (attention's
    num_heads stays its own: an attention record has no model)."""
    if "model_size" not in record.identity_fields():
        return (*record.identity_fields(), *more)
    fields = [name for name in record.identity_fields() if name not in MODEL_FIELDS]
    return ("model", *fields, *more)


def _tool_identity() -> dict[str, tuple[str, ...]]:
    """Each tool's identity: a record type's own (with what its tables also tell rows apart by), and
    the declared identity of the tools that write rows of their own (results/origin.py)."""
    from ..allreduce_bench.record import AllReduceRecord
    from ..attention_bench.record import AttentionRecord
    from ..ddp_bench.record import DdpRecord
    from ..loader_bench.record import LoaderRecord
    from ..results.records import BenchmarkRecord

    devices = {record: ("device_name",) for record in (DdpRecord, AttentionRecord, AllReduceRecord, LoaderRecord)}
    by_record = {BenchmarkRecord: ("size_table", "device_name"), **devices}
    return {
        **ROW_IDENTITY,
        **{record.tool: _identity(record, *more) for record, more in by_record.items()},
        # the torch profiler's operators of a benchmark row's profiled step, one row each (derive)
        "kernels": _identity(BenchmarkRecord, "size_table", "device_name", "kernel_rank", "kernel"),
        # a ddp_bench row's memory at each phase's peak, one row per phase (derive)
        "memory_phases": _identity(DdpRecord, "device_name", "phase"),
    }


# The file a row came from tells two runs of one configuration apart (two sweeps read together).
IDENTITY: dict[str, tuple[str, ...]] = {tool: (*names, "source") for tool, names in _tool_identity().items()}

LABEL_HEADERS = {
    "model": "model",
    "context_length": "context",
    "batch_size": "batch",
    "pass_type": "pass",
    "precision": "precision",
    "compile": "compile",
    "checkpoint_blocks": "checkpoint blocks",
    "world_size": "ranks",
    "bucket_cap_mb": "bucket (MB)",
    "head_dim": "d",
    "device_name": "device",
    "device": "torch device",
    "source": "file",
    "timestamp": "measured at",
    "warmup_steps": "warmup steps",
    "implementation": "implementation",
    "strategy": "strategy",
    "size": "size",
}

# Label words for values that read badly as written.
_WORDS = {
    "compile": {"true": "compiled", "false": "eager"},
    "cuda_graphs": {"true": "CUDA graphs", "false": "no graphs"},
    "fused_projections": {"true": "fused", "false": "separate"},
    "causal": {"true": "causal", "false": "non-causal"},
    "measured": {"true": "measured", "false": "warmup"},
}
_NUMERIC = {
    "context_length",
    "batch_size",
    "head_dim",
    "world_size",
    "bucket_cap_mb",
    "warmup_steps",
    "measure_steps",
    "step_index",
    "grad_accum_steps",
    "size_bytes",
    "num_workers",
    "order",
    "kernel_rank",
    "kernel_calls",
    "rank",
}


def model_label(row: dict) -> str:
    """A model by name: the size, the shape of a custom one, or the factory that built it."""
    dims = [
        (key, plain(row.get(name)))
        for key, name in (("d", "d_model"), ("L", "num_layers"), ("ff", "d_ff"), ("V", "vocab_size"))
    ]
    shape = " ".join(f"{key}{value}" for key, value in dims if value)  # a row may not carry the shape
    factory = row.get("model_factory")
    if isinstance(factory, str) and factory:
        return f"{factory.rsplit(':', 1)[-1]} {shape}"
    name, table = plain(row.get("model_size")), plain(row.get("size_table"))
    if name in ("", "custom"):
        return f"custom {shape}".strip()
    shapes = {str(sizes[name]) for sizes in SIZE_TABLES.values() if name in sizes}
    return f"{name} ({table})" if len(shapes) > 1 and table else name  # xl is another model in 2026


PHASES = ("forward", "backward", "optimizer")


def _phase_spread(samples: object) -> tuple[float | None, float | None]:
    """(std, cv %) of one phase's samples (a JSONL row keeps them; a CSV row does not)."""
    if not isinstance(samples, (list, tuple)) or len(samples) < 2:
        return None, None
    series = pd.Series(samples, dtype=float)
    mean, std = series.mean(), series.std()
    return std, (100 * std / mean if mean else None)


def derive(frame: pd.DataFrame, tool: str) -> pd.DataFrame:
    """The rows with the derived columns a report shows: the `model` label its identity names and,
    for benchmark rows read from JSONL, each phase's std and CV from the phase's samples."""
    if "model" in IDENTITY.get(tool, ()) and "model" not in frame.columns:
        frame = frame.copy()
        records = frame.astype(object).where(frame.notna(), None).to_dict("records")
        frame["model"] = [model_label(row) if any(f in row for f in MODEL_FIELDS) else "" for row in records]
    if tool == "kernels":  # once: rows already one per operator stay as they are
        return frame if "kernel_rank" in frame.columns else _kernel_rows(derive(frame, "benchmark"))
    if tool == "memory_phases":  # once: rows already one per phase stay as they are
        return frame if "phase" in frame.columns else _phase_rows(derive(frame, "ddp_bench"))
    if tool == "ddp_bench" and "memory_baseline_bytes" in frame.columns:  # a file of RSS peaks, torch's own included
        baseline = pd.to_numeric(frame["memory_baseline_bytes"], errors="coerce")
        peaks = {c: pd.to_numeric(frame[c], errors="coerce") - baseline for c in frame.columns if c.startswith("peak_")}
        frame = frame.drop(columns="memory_baseline_bytes").assign(**peaks)
    if tool == "benchmark":
        for phase in PHASES:
            samples = f"{phase}_samples_ms"
            if samples in frame.columns and f"{phase}_std_ms" not in frame.columns:
                frame = frame.copy()
                spread = [_phase_spread(s) for s in frame[samples]]
                frame[f"{phase}_std_ms"] = [s for s, _ in spread]
                frame[f"{phase}_cv_pct"] = [c for _, c in spread]
    return frame


def _phase_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per phase of each row's `memory_breakdown` (a JSONL row's), its categories as `*_bytes` columns."""
    rows = [
        {**row, "phase": entry.get("phase"), **{f"{k}_bytes": v for k, v in entry.items() if k != "phase"}}
        for row in frame.to_dict("records")
        for entry in (row.get("memory_breakdown") if isinstance(row.get("memory_breakdown"), list) else [])
        if isinstance(entry, dict)
    ]
    return pd.DataFrame(rows, columns=list(dict.fromkeys([*frame.columns, "phase", *(k for r in rows for k in r)])))


def _kernel_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per operator of each row's profiled step (`top_kernels`, longest first), with its rank
    and its share of the listed operators' time."""
    rows = []
    for row in frame.to_dict("records"):
        kernels = row.get("top_kernels")
        if not isinstance(kernels, (list, tuple)):
            continue
        total = sum(float(k.get("total_ms") or 0) for k in kernels)
        for rank, kernel in enumerate(kernels, 1):
            ms = float(kernel.get("total_ms") or 0)
            ahead = kernel.get("ahead_of_next")  # over several profiled steps (older rows: one step, no word)
            rows.append(
                {
                    **row,
                    "kernel_rank": rank,
                    "kernel": kernel.get("name"),
                    "kernel_calls": kernel.get("calls"),
                    "kernel_ms": ms,
                    # of all the step's operator time (older rows: of the listed ones)
                    "kernel_share_pct": kernel.get("share_pct", 100 * ms / total if total else None),
                    "kernel_ahead": None if ahead is None else ("yes" if ahead else "no"),
                }
            )
    columns = ["kernel_rank", "kernel", "kernel_calls", "kernel_ms", "kernel_share_pct", "kernel_ahead"]
    return pd.DataFrame(rows, columns=[*frame.columns, *columns])


def _truthy_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) or str(value) in ("True", "False", "true", "false") else ""


def label_text(name: str, row: dict) -> str:
    """The text a label cell (or a caption) shows for `row`'s `name`."""
    value = row.get(name)
    if missing(value) or value == "":
        return "off" if name == "checkpoint_blocks" else ""
    words = _WORDS.get(name)
    if words and (truthy := _truthy_text(value)):
        return words[truthy]
    if name in ("precision", "param_dtype", "compute_dtype") and isinstance(value, str):
        return value
    return plain(value)


def sort_key(name: str, row: dict) -> tuple:
    """Models by parameter count, numbers as numbers, the rest as first written (stable sort)."""
    if name == "model":
        params = row.get("num_params")
        if missing(params):
            params = _float(row.get("d_model")) ** 2 * _float(row.get("num_layers"))
        return (0, _float(params), label_text(name, row))
    if name in _NUMERIC:
        return (0, _float(row.get(name)), "")
    if name == "checkpoint_blocks":
        text = label_text(name, row)
        return (0, {"off": -1.0, "sqrt": 1e9, "all": 2e9}.get(text, _float(text)), text)
    return (1, 0.0, "")  # keep the file's order


def _float(value: object) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.inf
    return math.inf if math.isnan(number) else number


# Settings every row of a table shares, stated once in its caption; these say nothing to a reader.
_QUIET = {
    "seed",
    "device",
    "launcher",
    "threads_per_rank",
    "max_seconds",
    "base_lr",
    "base_batch_size",
    "step_index",
    "attention",
    "size_table",
    "compile_scope",
    "compile_mode",
    "source",  # named once, after the settings
    "table",
}
# settings left at their default say nothing either
_DEFAULTS = {
    "grad_accum_steps": "1",
    "cuda_graphs": "no graphs",
    "fused_projections": "separate",
    "checkpoint_blocks": "off",
    "timer": "host",
    "param_dtype": "fp32",
    "attention": "n/a",
}
_PHRASES = {
    "context_length": "context {}",
    "batch_size": "batch {}",
    "warmup_steps": "{} warmup steps",
    "measure_steps": "{} measured steps",
    "timer": "{} timer",
    "checkpoint_blocks": "checkpoint blocks {}",
    "grad_accum_steps": "gradient accumulation {}",
    "param_dtype": "{} parameters",
    "compile_scope": "compile scope {}",
    "compile_mode": "compile mode {}",
    "world_size": "{} ranks",
    "head_dim": "head dim {}",
    "num_heads": "{} heads",
    "size_table": "{} size table",
    "optimizer_factory": "optimizer {}",
    "adapters": "adapters {}",
    "bucket_cap_mb": "buckets of {} MB",
    "attention": "attention {}",
    "compute_dtype": "compute dtype {}",
    "optimizer": "optimizer {}",
    "target_iqr_pct": "measured until IQR/median <= {}%",
}


def describe_fixed(fixed: dict, tool: str) -> str:
    """'context 512, batch 4, fp32, eager, ...': the shared settings, in the identity's order."""
    order = {name: i for i, name in enumerate(IDENTITY.get(tool, ()))}
    words = []
    for name in sorted(fixed, key=lambda n: order.get(n, len(order))):
        text = fixed[name]
        if name in _QUIET or text in ("", "n/a") or _DEFAULTS.get(name) == text:
            continue
        words.append(_PHRASES.get(name, "{}").format(text))
    return ", ".join(words)
