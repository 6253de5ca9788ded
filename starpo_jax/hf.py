"""``python -m starpo_jax.hf`` (installed: ``starpo-hf``): imports, exports
and verifies checkpoints (``starpo_jax.cli.hf``)."""

from starpo_jax.cli.hf import entry

if __name__ == "__main__":
  entry()
