"""cs336-bench: a benchmarking harness for Transformer language models (CS336 assignment 2), the package cs336_systems."""

__version__ = "0.1.0"
