"""RNN benchmark: memory saved vs slowdown of checkpointing strategies, against store-all."""
