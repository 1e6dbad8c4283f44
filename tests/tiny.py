"""The tiny runs' flags: one table shared by the tests and scripts/checks/bad_inputs.py.

A test spells out only what it is about and takes the rest from here, so a cheaper tiny run is one edit.
The parts compose: a model, a batch (one configuration) or a cell (a sweep's grid of one), a device,
the fewest steps that have a spread, and what benchmark-like tools skip to start fast.
"""

MODEL = ["--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "97"]
BATCH = ["--context-length", "16", "--batch-size", "2"]  # one configuration
CELL = ["--context-lengths", "8", "--batch-sizes", "2"]  # a sweep's grid of one configuration
CPU = ["--device", "cpu"]
STEPS = ["--warmup-steps", "1", "--measure-steps", "2"]  # a median and a spread, every timed tool
PEAK = ["--peak-tflops", "1"]  # benchmark-like tools: a given MFU peak, no matmul probe
# benchmark-like tools: no profiled step (torch.profiler imports torch._inductor, a second per
# process; the tests of it ask for it)
NO_PROFILE = ["--no-profile-step"]

TINY_SHAPE = MODEL
TINY_BATCH = BATCH
TINY_CPU = [*CPU, *PEAK]
TINY_STEPS = [*STEPS, *NO_PROFILE]
TINY_SWEEP = [*MODEL, *TINY_CPU, *TINY_STEPS]  # each sweep test adds its grid
TINY = [*TINY_SWEEP, *BATCH]  # one `benchmark` configuration
TINY_GRID = [*TINY_SWEEP, *CELL]  # a sweep of one configuration
TINY_DDP = [*MODEL, *BATCH, *STEPS]  # ddp_bench; allreduce_bench takes STEPS
