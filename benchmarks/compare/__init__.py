"""starpo-jax beside its peers on the same workload, each side in its own
process: PyTorch (``pytorch``, the loop a careful user writes) and Tunix
(``tunix``, in its own virtual environment)."""
