"""b70bench: communication, kernel and end-to-end decode benchmarks for LLM inference stacks."""

__version__ = "0.1.0"
