import sys

from cs336_systems.allreduce_bench.cli import main

sys.exit(main())
