"""python -m cs336_systems.handout: the CS336 assignment 2 (systems) handout in one command.

problems/ holds every problem of both editions as one object each (how the plan measures it with
this project's tools, how the write-up answers it); parameters.py the handout's numbers at each
scale; plan.py predicts each step's time and memory and fits the plan to the device; budget.py fits it
to --budget; run.py runs the steps in child processes with done markers; executing.py, jobs.py and
nodes.py run them as jobs of --executor local or slurm; writeup.py puts the problems' sections
together (report's documents and tables); cli.py parses the flags.
"""
