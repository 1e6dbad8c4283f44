"""cs336-systems: a benchmarking harness for Transformer language models (CS336 assignment 2)."""

__version__ = "0.1.0"
