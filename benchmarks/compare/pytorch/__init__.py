"""StarPO in PyTorch, the baseline of ``python -m benchmarks.compare.run``."""
