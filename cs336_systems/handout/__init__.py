"""python -m cs336_systems.handout: the CS336 assignment 2 (systems) handout in one command.

parameters.py holds each edition's problems and the handout's numbers; problems/ maps each
measurable problem to this project's tools with them; plan.py predicts each step's time and memory
and fits the plan to the device and the budget; run.py runs the steps in child processes with done
markers; cli.py parses the flags and hands the outputs to `report`.
"""
