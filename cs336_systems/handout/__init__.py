"""python -m cs336_systems.handout: the CS336 assignment 2 (systems) handout in one command.

problems.py maps each measurable problem of an edition to this project's tools with the handout's
parameters; plan.py predicts each step's time and memory and fits the plan to the device and the
budget; run.py runs the steps in child processes with done markers; cli.py parses the flags and
hands the outputs to `report`.
"""
