"""cs336-bench TOOL ARGS: the console command (python -m cs336_bench TOOL ARGS does the same)."""

import sys


def main() -> int:
    from cs336_bench.tools import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
