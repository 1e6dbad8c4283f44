from ..lifetime import exit_with
from .cli import main

exit_with(main)  # ends when main returns, whatever the user's code left running
