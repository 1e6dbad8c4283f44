import sys

from cs336_systems.memory.cli import main

sys.exit(main())
