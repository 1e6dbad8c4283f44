"""python -m cs336_systems.mixed_precision: what lower precision does to a sum and to a model.

1. Accumulation (CS336 assignment 2): add 0.01 one thousand times (exact answer 10) with the
   accumulator and the addend in fp32 or fp16, and print what comes out and why.
2. Autocast: the handout's toy model (fc1 -> ReLU -> LayerNorm -> fc2, cross-entropy) run
   under fp16 and bf16 autocast; the dtype of its parameters, each layer's output, the
   loss and the gradients, with the rule that produced each.

    cs336-bench mixed_precision --device auto --output mixed_precision.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import nn

from .argtypes import ArgumentParser, add_device_argument, add_output_argument
from .command import Command
from .device import resolve_device
from .errors import UsageError
from .tools import prog

PROG = prog("mixed_precision")
STEPS, ADDEND, EXACT = 1000, 0.01, 10.0
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def accumulate(
    accumulator: torch.dtype,
    addend: torch.dtype,
    cast_to: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    steps: int = STEPS,
    value: float = ADDEND,
) -> float:
    """The handout's loop: s = 0; s += tensor(value, addend dtype) `steps` times."""
    total = torch.tensor(0, dtype=accumulator, device=device)
    for _ in range(steps):
        x = torch.tensor(value, dtype=addend, device=device)
        total += x if cast_to is None else x.type(cast_to)
    return float(total.item())


def spacing(x: float, dtype: torch.dtype) -> float:
    """Distance between consecutive numbers of `dtype` around x (one unit in the last place)."""
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(x)))


def stored(value: float, dtype: torch.dtype) -> float:
    """What `dtype` actually stores for `value`."""
    return float(torch.tensor(value, dtype=dtype).double())


@dataclass(frozen=True)
class Accumulation:
    experiment: str
    accumulator: str
    addend: str
    value: float
    why: str

    @property
    def error(self) -> float:
        return self.value - EXACT


def accumulation_experiments(device: torch.device | str = "cpu") -> list[Accumulation]:
    """The four experiments of the handout, and bf16 for comparison."""
    f32, f16, b16 = torch.float32, torch.float16, torch.bfloat16
    fp32_sum = accumulate(f32, f32, device=device)
    fp16_sum = accumulate(f16, f16, device=device)
    mixed_sum = accumulate(f32, f16, device=device)
    cast_sum = accumulate(f32, f16, cast_to=f32, device=device)
    bf16_sum = accumulate(b16, b16, device=device)
    h = stored(ADDEND, f16)
    return [
        Accumulation(
            "1. fp32 += fp32",
            "fp32",
            "fp32",
            fp32_sum,
            f"fp32 stores 0.01 as {stored(ADDEND, f32):.10f}; each partial sum is rounded to fp32's grid "
            f"({spacing(EXACT, f32):.1e} apart near 10) and 1000 roundings add up to {fp32_sum - EXACT:+.1e}",
        ),
        Accumulation(
            "2. fp16 += fp16",
            "fp16",
            "fp16",
            fp16_sum,
            f"from 8 on fp16 numbers are {spacing(EXACT, f16):g} apart, so each +0.01 lands there as "
            f"+{spacing(EXACT, f16):g} (below 8, as other multiples of a finer grid): the sum ends "
            f"{fp16_sum - EXACT:+.4f} off; the fp16 accumulator is what goes wrong",
        ),
        Accumulation(
            "3. fp32 += fp16",
            "fp32",
            "fp16",
            mixed_sum,
            f"fp16 stores 0.01 as {h:.10f} and += promotes it to fp32 exactly: the sum is ~1000x that "
            f"({1000 * h:.6f}); the error is the addend's, not the accumulation's",
        ),
        Accumulation(
            "4. fp32 += fp16 cast to fp32",
            "fp32",
            "fp16 -> fp32",
            cast_sum,
            "the same numbers as 3: the explicit cast does what += already did; casting cannot restore "
            "the digits fp16 dropped from 0.01",
        ),
        Accumulation(
            "(extra) bf16 += bf16",
            "bf16",
            "bf16",
            bf16_sum,
            f"bf16 keeps 8 significant bits: from 4 on its numbers are {spacing(4.0, b16):g} apart, more than "
            f"twice 0.01, so each addition rounds back to the same value and the sum stalls at {bf16_sum:g}",
        ),
    ]


class ToyModel(nn.Module):
    """The handout's toy model."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        x = self.fc2(x)
        return x


TENSORS = ("parameters", "fc1 output", "ReLU output", "LayerNorm output", "logits (fc2 output)", "loss", "gradients")


def autocast_dtypes(dtype: torch.dtype, device: torch.device | str = "cpu", seed: int = 0) -> dict[str, str]:
    """{tensor: dtype name} for one forward, loss and backward of ToyModel under autocast to `dtype`."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = ToyModel(16, 5).to(device)
    x = torch.randn(4, 16, device=device)
    targets = torch.randint(0, 5, (4,), device=device)
    seen: dict[str, torch.dtype] = {}
    names = {model.fc1: "fc1 output", model.relu: "ReLU output", model.ln: "LayerNorm output"}
    names[model.fc2] = "logits (fc2 output)"
    hooks = [m.register_forward_hook(lambda m, i, out: seen.__setitem__(names[m], out.dtype)) for m in names]
    with torch.autocast(device_type=device.type, dtype=dtype):
        logits = model(x)
        loss = F.cross_entropy(logits, targets)
    loss.backward()
    for hook in hooks:
        hook.remove()
    seen["parameters"] = _one({p.dtype for p in model.parameters()})
    seen["loss"] = loss.dtype
    seen["gradients"] = _one({p.grad.dtype for p in model.parameters()})
    return {name: NAMES.get(seen[name], str(seen[name])) for name in TENSORS}


def _one(dtypes: set[torch.dtype]) -> torch.dtype:
    if len(dtypes) != 1:
        raise AssertionError(f"expected one dtype, got {dtypes}")
    return dtypes.pop()


def autocast_why(name: str, fp16: str, bf16: str, device_type: str) -> str:
    """One line: the autocast rule behind the observed dtypes of `name`."""
    low = "fp16/bf16" if (fp16, bf16) == ("fp16", "bf16") else f"{fp16}/{bf16}"
    if name == "parameters":
        return "autocast never changes stored weights: it casts a low-precision copy for each op that wants one"
    if name == "fc1 output":
        return f"linear (a matmul) is on autocast's low-precision list: input and weight are cast, the output is {low}"
    if name == "ReLU output":
        return "ReLU is on neither list: it runs in its input's dtype"
    if name == "LayerNorm output":
        if fp16 == bf16 == "fp32":
            return (
                f"on {device_type} autocast runs layer_norm in fp32: its mean and variance are sums of squares that "
                "overflow fp16 (max 65504) and lose digits; bf16 has fp32's range but 8-bit precision, so it gets fp32 too"
            )
        return (
            f"on {device_type} autocast leaves layer_norm alone: it runs in its input's dtype ({low}); on CUDA it is "
            "on the fp32 list (its mean/variance reductions overflow fp16), so there the output is fp32"
        )
    if name == "logits (fc2 output)":
        return f"linear again: autocast casts its input and weight, the logits are {low}"
    if name == "loss":
        return (
            "autocast runs the loss in fp32 (nll_loss is on its fp32 list; on CUDA log_softmax is too): "
            "exp, log and the sum over classes need fp32's range and precision"
        )
    if name == "gradients":
        return (
            "a gradient has its tensor's dtype: the backward of each autocast cast turns the low-precision "
            "gradient back into fp32, so the fp32 parameters get fp32 .grad"
        )
    raise ValueError(f"unknown tensor {name!r}")


def result_rows(device: torch.device) -> list[dict]:
    """Both tables as rows, each with the device and the environment it ran in: `table` is
    'accumulation' (experiment, accumulator, addend, result, error, why) or 'autocast' (tensor,
    fp16, bf16, why), the dtypes each tensor of the toy model has under fp16 and bf16 autocast."""
    from .results import collect_environment

    env = dataclasses.asdict(collect_environment(device))
    rows = [
        dict(
            table="accumulation",
            experiment=a.experiment,
            accumulator=a.accumulator,
            addend=a.addend,
            result=a.value,
            error=a.error,
            why=a.why,
        )
        for a in accumulation_experiments(device)
    ]
    fp16, bf16 = autocast_dtypes(torch.float16, device), autocast_dtypes(torch.bfloat16, device)
    rows += [
        dict(
            table="autocast",
            tensor=name,
            fp16=fp16[name],
            bf16=bf16[name],
            why=autocast_why(name, fp16[name], bf16[name], device.type),
        )
        for name in TENSORS
    ]
    return [{**row, "device": str(device), **env} for row in rows]


def report(rows: list[dict]) -> str:
    """The printed page: both tables as Markdown."""
    first = rows[0]
    lines = [
        f"Mixed precision on {first['device_name']} ({first['device']}), torch {first['torch_version']}",
        "",
        f"Adding 0.01 {STEPS} times (exact answer {EXACT:g}):",
        "",
    ]
    accumulation = [
        (r["experiment"], r["accumulator"], r["addend"], repr(r["result"]), f"{r['error']:+.6f}", r["why"])
        for r in rows
        if r["table"] == "accumulation"
    ]
    headers = ["experiment", "accumulator", "addend", "result", "error", "why"]
    lines += [tabulate(accumulation, headers=headers, tablefmt="github", disable_numparse=True), ""]
    lines += [
        "Toy model (fc1 -> ReLU -> LayerNorm -> fc2, cross-entropy) under torch.autocast:",
        "",
        tabulate(
            [(r["tensor"], r["fp16"], r["bf16"], r["why"]) for r in rows if r["table"] == "autocast"],
            headers=["tensor", "fp16 autocast", "bf16 autocast", "why"],
            tablefmt="github",
            disable_numparse=True,
        ),
    ]
    return "\n".join(lines) + "\n"


def write_rows(rows: list[dict], path: Path, tool: str = "mixed_precision") -> None:
    """One file of both tables' rows: .csv (a `table` column tells them apart) or .jsonl, each row
    naming `tool` (residuals writes its rows this way too)."""
    from .results import write_whole
    from .results.origin import named

    rows = named(tool, rows)
    if path.suffix == ".csv":
        text = pd.DataFrame(rows).to_csv(index=False)
    else:
        text = "".join(json.dumps(row) + "\n" for row in rows)
    write_whole(path, text)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_device_argument(parser)
    add_output_argument(
        parser, help="also write the printed values as rows to PATH (.csv or .jsonl; repeatable)", absolute=False
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from .results import check_output_paths

    device = resolve_device(args.device)
    wrong = [path for path in args.output if Path(path).suffix not in (".csv", ".jsonl")]
    if wrong:
        raise UsageError(f"--output {wrong[0]}: mixed_precision writes .csv or .jsonl")
    outputs = check_output_paths(args.output)
    rows = result_rows(device)
    print(report(rows), end="")
    for path in outputs:
        write_rows(rows, path)
    return 0


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
