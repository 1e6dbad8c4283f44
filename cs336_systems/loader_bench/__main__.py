from .cli import main

main.start()  # ends when main returns, whatever the user's code left running
