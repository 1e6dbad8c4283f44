import sys

from cs336_systems.monitor.cli import main

sys.exit(main())
