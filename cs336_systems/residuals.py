"""python -m cs336_systems.residuals: the tensors autograd saves for backward ("residuals").

For one Transformer block (and totals for the whole model) it lists every tensor a
saved-tensor hook sees: shape, dtype, bytes, the op that saved it (its backward node,
found by walking the graph and unpacking each node's saved tensors) and the estimator
component it belongs to. Parameters are left out (they exist anyway); a storage saved by
several ops counts once. Totals per block come for the eager and the torch.compile'd
block, with and without activation checkpointing, next to the numbers the memory
estimator uses (cs336_systems.memory.estimate), so the two can be compared line by line.

Example:
    cs336-bench residuals --model-size small --context-length 512 --batch-size 4 --precision bf16
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import nn
from torch.utils.checkpoint import checkpoint

from .argtypes import ArgumentParser, add_device_argument, add_output_argument, exit_status
from .benchmark_flags import (
    add_model_arguments,
    add_shape_arguments,
    announce_size_table,
    model_config_from_args,
    size_table_of,
)
from .command import Command
from .device import DeviceError, compile_unsupported_reason, failure_status, resolve_device
from .layers import TransformerBlock
from .memory.estimate import FP32, block_saved_bytes
from .models import ConfigError, ModelConfig, TransformerLM
from .precision import autocast, unsupported_reason
from .results import check_output_paths
from .step import compiling
from .tools import prog
from .units import MIB

PROG = prog("residuals")

# Where a tensor saved inside a block's submodule goes in the estimator's breakdown.
COMPILED = "compiled graph (not split by component)"
PROJECTION_INPUTS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "ffn.w1", "ffn.w3")


@dataclass(frozen=True)
class SavedTensor:
    module: str  # the submodule that was running when it was saved ("" = the model's top level)
    op: str  # the backward node that saved it, e.g. MmBackward0
    shape: tuple[int, ...]
    dtype: str
    bytes: int  # of its storage
    kind: str  # activation, parameter, weight copy (autocast's cast of a parameter), checkpoint input
    component: str
    counted: bool  # False when an earlier tensor shares its storage (or it is a parameter)


def component_of(module: str, attention: str, requires_grad: bool) -> str:
    """The estimator's component for a tensor saved in block submodule `module`."""
    name = module.split(".", 2)[-1] if module.startswith("layers.") else module
    if name in ("ln1", "ln2"):
        return "rmsnorm"
    if name in PROJECTION_INPUTS:
        return "projection inputs"
    if name == "attn.rope" and not requires_grad:
        return "rope cos/sin copies"
    if name.startswith("attn"):
        return f"attention ({attention})"
    if name.startswith("ffn"):
        return "swiglu"
    return "final norm, LM head and loss"


@contextlib.contextmanager
def module_tracker(root: nn.Module) -> Iterator[list[str]]:
    """A stack of the qualified names of the submodules running now."""
    stack: list[str] = []
    handles = []
    for name, module in root.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(lambda _m, _a, name=name: stack.append(name)))
            handles.append(module.register_forward_hook(lambda _m, _a, _o: [stack.pop(), None][1]))
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


def record_saved(
    root: nn.Module, run: Callable[[], torch.Tensor], attention: str, checkpointed: bool = False, compiled: bool = False
) -> list[SavedTensor]:
    """Run `run` (forward, returning what backward would start from) under saved-tensor hooks.

    Under non-reentrant checkpointing the hooks see only what the checkpoint keeps (its
    inputs); unpacking anything inside would run the forward again, so the graph is not walked.
    A compiled graph saves its tensors as one node, so they are not split by component.
    """
    parameters = {p.untyped_storage().data_ptr() for p in root.parameters()}
    buffers = {b.untyped_storage().data_ptr() for b in root.buffers()}
    tensors: list[torch.Tensor] = []
    modules: list[str] = []
    ops: dict[int, str] = {}
    current: list[str] = [""]

    def pack(tensor: torch.Tensor) -> int:
        tensors.append(tensor)
        modules.append(stack[-1] if stack else "")
        return len(tensors) - 1

    def unpack(index: int) -> torch.Tensor:
        ops.setdefault(index, current[0])
        return tensors[index]

    with module_tracker(root) as stack, torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = run()
        if not checkpointed:
            _walk(out.grad_fn, current)

    rows, seen = [], set()
    for index, tensor in enumerate(tensors):
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer in parameters:
            kind = "parameter"
        elif pointer in buffers:
            kind = "buffer"
        elif checkpointed:
            kind = "checkpoint input"
        elif _is_weight_cast(tensor):
            kind = "weight copy"
        else:
            kind = "activation"
        counted = kind in ("activation", "weight copy", "checkpoint input") and pointer not in seen
        seen.add(pointer)
        component = {"weight copy": "autocast weight copies", "checkpoint input": "checkpointed group inputs"}.get(
            kind, COMPILED if compiled else component_of(modules[index], attention, tensor.requires_grad)
        )
        rows.append(
            SavedTensor(
                module=modules[index],
                op="checkpoint (inputs kept)" if checkpointed else ops.get(index, "?"),
                shape=tuple(tensor.shape),
                dtype=str(tensor.dtype).removeprefix("torch."),
                bytes=storage.nbytes(),
                kind=kind,
                counted=counted,
                component=component,
            )
        )
    return rows


def _walk(node, current: list[str]) -> None:
    """Unpack every saved tensor of every node reachable from `node`, naming the op that saved it."""
    todo, visited = [node], set()
    while todo:
        node = todo.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        current[0] = node.name()
        for attribute in dir(node):
            if attribute.startswith("_saved_") or attribute == "saved_tensors":
                with contextlib.suppress(Exception):  # some attributes are sizes, or already freed
                    getattr(node, attribute)
        todo.extend(next_node for next_node, _ in node.next_functions)


def _is_weight_cast(tensor: torch.Tensor) -> bool:
    """Autocast's cast of a parameter (or a view of one, as mm saves W.t()): a ToCopy of a leaf."""
    fn = (tensor._base if tensor._base is not None else tensor).grad_fn
    return (
        fn is not None
        and fn.name() == "ToCopyBackward0"
        and fn.next_functions[0][0].name() == "torch::autograd::AccumulateGrad"
    )


def block_residuals(
    config: ModelConfig,
    batch: int,
    seq: int,
    precision: str,
    device: torch.device,
    compiled: bool = False,
    checkpointed: bool = False,
) -> list[SavedTensor]:
    """The saved tensors of one block's forward (input: a fresh fp32 residual stream)."""
    torch.manual_seed(0)
    with torch.device(device):
        block = TransformerBlock(config)
        x = torch.randn(batch, seq, config.d_model, requires_grad=True)
    forward = torch.compile(block) if compiled else block

    def run() -> torch.Tensor:
        with autocast(precision, device):
            if checkpointed:
                return checkpoint(forward, x, use_reentrant=False)
            return forward(x)

    if not compiled:
        return record_saved(block, run, config.attention, checkpointed, compiled)
    torch._dynamo.reset()  # and the files a compile killed mid-build left in its cache removed (step.compiling)
    return compiling(lambda: record_saved(block, run, config.attention, checkpointed, compiled), [])


def model_residuals(
    config: ModelConfig, batch: int, seq: int, precision: str, device: torch.device
) -> list[SavedTensor]:
    """The saved tensors of the whole model's forward and loss (the step's residuals)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = TransformerLM(config)
        tokens = torch.randint(0, config.vocab_size, (batch, seq))

    def run() -> torch.Tensor:
        with autocast(precision, device):
            logits = model(tokens)
            return F.cross_entropy(logits.reshape(-1, config.vocab_size), tokens.reshape(-1))

    return record_saved(model, run, config.attention)


def totals(rows: list[SavedTensor]) -> dict[str, int]:
    """Bytes per component, each storage once, parameters left out."""
    out: dict[str, int] = {}
    for row in rows:
        if row.counted:
            out[row.component] = out.get(row.component, 0) + row.bytes
    return out


def contributions(rows: list[SavedTensor]) -> list[dict]:
    """What each (submodule, op) of a block saves for backward, counted storages only, largest
    first, with its share of the block's total: the handout's "largest contributing operations"."""
    found: dict[tuple[str, str], dict] = {}
    for row in rows:
        if row.counted:
            entry = found.setdefault(
                (row.module or "(input)", row.op), {"tensors": 0, "bytes": 0, "component": row.component}
            )
            entry["tensors"] += 1
            entry["bytes"] += row.bytes
    total = sum(entry["bytes"] for entry in found.values()) or 1
    ordered = sorted(found.items(), key=lambda item: -item[1]["bytes"])
    return [
        {"rank": rank, "module": module, "op": op, **entry, "share_pct": 100 * entry["bytes"] / total}
        for rank, ((module, op), entry) in enumerate(ordered, 1)
    ]


def block_table(rows: list[SavedTensor]) -> str:
    body = [
        [
            r.module or "(input)",
            r.op,
            "x".join(map(str, r.shape)),
            r.dtype,
            r.bytes,
            r.kind,
            r.component,
            "yes" if r.counted else (f"no ({r.kind})" if r.kind in ("parameter", "buffer") else "no (shared storage)"),
        ]
        for r in rows
    ]
    headers = ["module", "saved by", "shape", "dtype", "bytes", "kind", "component", "counted"]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_model_arguments(parser, pass_type=False)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd block")
    parser.add_argument("--no-model", action="store_true", help="skip the whole model's totals")
    add_output_argument(
        parser,
        help="also write what each (submodule, op) of the eager block saves, largest first, to PATH (.csv or .jsonl)",
        absolute=False,
    )
    add_device_argument(parser, default="cpu")
    add_shape_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.model_factory:
        raise ConfigError("residuals reads the built-in model's blocks; drop --model-factory")
    table = size_table_of(args, [args.model_size])
    config = model_config_from_args(args, table, args.model_size, args.context_length, args.attention)
    config.check_context(args.context_length)
    if reason := unsupported_reason(args.precision, device):
        raise DeviceError(reason)
    wrong = [path for path in args.output if Path(path).suffix not in (".csv", ".jsonl")]
    if wrong:
        raise ConfigError(f"--output {wrong[0]}: residuals writes .csv or .jsonl")
    outputs = check_output_paths(args.output)
    announce_size_table(table)
    try:
        return _report(args, config, device, outputs)
    except (RuntimeError, MemoryError) as exc:  # a size that cannot be allocated: a result, in one line
        status, error = failure_status(exc)
        if status != "oom":
            raise
        print(
            f"{PROG}: oom: batch {args.batch_size} x context {args.context_length} of this model does not fit on "
            f"{device}: {error}",
            file=sys.stderr,
        )
        return exit_status([status])


def _report(args, config: ModelConfig, device: torch.device, outputs: list[Path]) -> int:
    batch, seq = args.batch_size, args.context_length
    rows = block_residuals(config, batch, seq, args.precision, device)
    estimate = block_saved_bytes(config, batch, seq, args.precision, device.type)
    print(
        f"# Residuals of one block: {config.size_table} {config.size_name} d_model {config.d_model}, "
        f"batch {batch}, context {seq}, {args.precision}, {args.attention}, {device}\n"
    )
    print(block_table(rows), "\n")
    if outputs:
        write_contributions(args, config, device, rows, outputs)

    variants = [("eager", False, False), ("eager, checkpointed", False, True)]
    compile_reason = compile_unsupported_reason(device)
    if not args.no_compile and compile_reason is None:
        variants += [("compiled", True, False), ("compiled, checkpointed", True, True)]
    measured = {
        name: totals(block_residuals(config, batch, seq, args.precision, device, c, k)) for name, c, k in variants
    }
    measured["eager"] = totals(rows)
    measured["estimator"] = estimate
    measured["estimator, checkpointed"] = {"checkpointed group inputs": batch * seq * config.d_model * FP32}
    components = list(dict.fromkeys(c for t in measured.values() for c in t))
    body = [[c, *(f"{t.get(c, 0) / MIB:.3f}" for t in measured.values())] for c in components]
    body.append(["total", *(f"{sum(t.values()) / MIB:.3f}" for t in measured.values())])
    print("## Per block, MiB (each storage once; parameters left out)\n")
    print(tabulate(body, headers=["component", *measured, "estimator"], tablefmt="github", disable_numparse=True))
    print(
        f"\nestimator: cs336_systems.memory.estimate.block_saved_bytes; a checkpointed block keeps only its "
        f"input ({batch * seq * config.d_model * FP32 / MIB:.3f} MiB) and rebuilds the rest in backward."
    )
    if not args.no_compile and compile_reason is not None:
        print(f"(compiled block skipped: {compile_reason})")
    if not args.no_model:
        whole = totals(model_residuals(config, batch, seq, args.precision, device))
        print(f"\n## Whole model ({config.num_layers} blocks, forward + loss), MiB\n")
        print(
            tabulate(
                [[c, f"{v / MIB:.3f}"] for c, v in whole.items()] + [["total", f"{sum(whole.values()) / MIB:.3f}"]],
                headers=["component", "saved"],
                tablefmt="github",
                disable_numparse=True,
            )
        )
    return 0


def write_contributions(args, config: ModelConfig, device: torch.device, rows: list[SavedTensor], outputs) -> None:
    """contributions() as rows, each with the configuration and the environment it was measured in."""
    import dataclasses

    from .mixed_precision import write_rows
    from .results import collect_environment

    environment = dataclasses.asdict(collect_environment(device))
    setting = {
        "size_table": config.size_table,
        "model_size": config.size_name,
        "d_model": config.d_model,
        "d_ff": config.d_ff,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "vocab_size": config.vocab_size,
        "batch_size": args.batch_size,
        "context_length": args.context_length,
        "precision": args.precision,
        "attention": args.attention,
        "device": str(device),
    }
    table = [{**setting, **row, **environment} for row in contributions(rows)]
    for path in outputs:
        write_rows(table, path, "residuals")


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
