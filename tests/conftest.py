import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                       # shared test helpers (models.py)
sys.path.insert(0, os.path.dirname(HERE))      # the repository root (benchmarks package)
