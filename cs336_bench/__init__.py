"""cs336-bench: this project's tools under a name no student's package has.

`import cs336_bench.benchmark` loads cs336_systems/benchmark.py as `cs336_bench.benchmark`, so a
student's own `cs336_systems` can be imported in the same process without either replacing the
other (cs336_systems/tools.py says more). Only `__main__` lives here; every other module is found
in the sibling cs336_systems directory.

Once this package is imported, `import cs336_systems` prefers any other `cs336_systems` (the
student's, from the current directory, the path or their own install) to ours: the two
distributions may both be installed, and the student's code must get theirs.
"""

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OURS = HERE.parent / "cs336_systems"
__path__ = [str(HERE), str(OURS)]
__version__ = "0.1.0"


def _is_ours(spec) -> bool:
    locations = [*(spec.submodule_search_locations or []), spec.origin or ""]
    return any(location and Path(location).resolve() in (OURS, OURS / "__init__.py") for location in locations)


class TheirsFirst(importlib.abc.MetaPathFinder):
    """Finds top-level `cs336_systems` anywhere but in our own directory; None (ours, found by the
    usual finders after this one) when there is no other."""

    def find_spec(self, name, path=None, target=None):
        if name != "cs336_systems" or path is not None:
            return None
        entries = [entry for entry in sys.path if Path(entry or ".").resolve() != OURS.parent]
        spec = importlib.machinery.PathFinder.find_spec(name, entries, target)
        if spec is not None and not _is_ours(spec):
            return spec
        for finder in sys.meta_path:  # editable installs' finders, each mapping a name to a directory
            if finder is self or finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, None, target)
            if spec is not None and not _is_ours(spec):
                return spec
        return None


if not any(isinstance(finder, TheirsFirst) for finder in sys.meta_path):
    sys.meta_path.insert(0, TheirsFirst())

from .tools import import_ours_first  # noqa: E402

import_ours_first()
