"""Published checkpointing claims reproduced side by side with bincheck (issue 12).

``python -m benchmarks.reproduce [--quick] [--out DIR] [--only sargent,siskind]``; see README.md.

* :mod:`.sargent`: K. Sargent's "Binomial checkpointing in autograd" (LSTM and RNN settings, and
  the mismatch between his two LSTM scripts), measured like for like;
* :mod:`.siskind`: the nested-loop example of Siskind & Pearlmutter (OMS 2018): a flat
  ``checkpointed_while_loop`` over atomic steps vs store-all vs binomial over the outer loop.

Only bincheck's public API is used. This module imports nothing heavy, so that the CLI can set the
BLAS thread count before numpy is loaded.
"""
