import sys

from cs336_systems.loader_bench.cli import main

sys.exit(main())
