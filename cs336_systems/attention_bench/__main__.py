import sys

from cs336_systems.attention_bench.cli import main

sys.exit(main())
