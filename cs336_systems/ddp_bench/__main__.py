import sys

from cs336_systems.ddp_bench.cli import main

sys.exit(main())
