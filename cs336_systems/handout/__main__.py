import sys

from cs336_systems.handout.cli import main

sys.exit(main())
