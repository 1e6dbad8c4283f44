"""What the user's code can change for the whole process that a measurement depends on (the clocks, torch's
default dtype and float32 matmul precision): usercode.guarded puts each back (`kept`) and says which."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

CLOCKS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns")
MATMUL = "torch.set_float32_matmul_precision"  # the row records what was in effect; the others make it 'wrong'


def _settings() -> dict:
    """{name: (read, write)}; torch's only where torch is loaded (the code cannot have changed them else)."""
    found = {f"time.{n}": (lambda n=n: getattr(time, n), lambda v, n=n: setattr(time, n, v)) for n in CLOCKS}
    if torch := sys.modules.get("torch"):
        found["torch.set_default_dtype"] = (torch.get_default_dtype, torch.set_default_dtype)
        found[MATMUL] = (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision)
    return found


@contextlib.contextmanager
def kept(changed: dict) -> Iterator[None]:
    """Inside, the code may change the settings; on leaving each is put back and `changed[name]` is the
    value the code had set. One torch cannot read (a TF32 flag set through its newer API) is left alone."""
    before = {}
    for name, (read, _) in _settings().items():
        with contextlib.suppress(RuntimeError):
            before[name] = read()
    try:
        yield
    finally:
        for name, (read, write) in _settings().items():
            with contextlib.suppress(RuntimeError):
                if name in before and (now := read()) is not before[name] and now != before[name]:
                    changed[name] = now
                    write(before[name])


def verdict(changed: dict, who: str) -> tuple[str | None, list[str]]:
    """(the row's error, or None; its notes) for what `who` changed while it ran: a clock or the default
    dtype make the step another than its configuration's ('wrong'); the matmul precision is the row's own."""
    said = {
        name: f"called {name}({value!r})" if "set_" in name else f"replaced {name}" for name, value in changed.items()
    }
    notes = [f"{who} {said.pop(MATMUL)}: matmul_precision is what it set"] if MATMUL in said else []
    error = (
        f"{who} {'; '.join(said.values())} for the whole process (put back after it ran): not this configuration's step"
    )
    return (error if said else None), notes
