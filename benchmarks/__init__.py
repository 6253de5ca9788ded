"""Throughput benchmarks: this project beside its Python/PyTorch peers.

The benchmarks are commands (``python -m benchmarks.run``): like the
library's, they let libtpu start quietly where no TPU chip is attached.
"""

from starpo_jax.cli.app import quiet_libtpu

quiet_libtpu()
