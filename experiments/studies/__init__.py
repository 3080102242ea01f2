"""The studies of experiments/study.py, one module each (see common.py)."""
