"""``python -m benchmarks.torch``: bincheck.torch against torch's own checkpointing (see README)."""
