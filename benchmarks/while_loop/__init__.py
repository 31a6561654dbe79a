"""While-loop benchmark (python -m benchmarks.while_loop)."""
