"""Throughput benchmarks: this project beside its Python/PyTorch peers."""
