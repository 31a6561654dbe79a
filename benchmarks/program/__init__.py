"""``python -m benchmarks.program``: bincheck.torch on whole networks against torch (see README)."""
