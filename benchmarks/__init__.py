"""Benchmarks for bincheck (run as modules, e.g. ``python -m benchmarks.rnn``)."""
