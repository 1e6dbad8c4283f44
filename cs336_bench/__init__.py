"""cs336-bench: this project's tools under a name no student's package has.

`import cs336_bench.benchmark` loads cs336_systems/benchmark.py as `cs336_bench.benchmark`, so a
student's own `cs336_systems` can be imported in the same process without either replacing the
other (cs336_systems/tools.py says more). Only `__main__` lives here; every other module is found
in the sibling cs336_systems directory.
"""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "cs336_systems")]
__version__ = "0.1.0"
