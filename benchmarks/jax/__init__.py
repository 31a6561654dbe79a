"""``python -m benchmarks.jax``: bincheck.jax against JAX's own checkpointing and Equinox."""
