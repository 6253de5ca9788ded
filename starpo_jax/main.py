"""``python -m starpo_jax.main`` (installed: ``starpo-train``): trains a
policy (``starpo_jax.cli.main``)."""

from starpo_jax.cli.main import entry

if __name__ == "__main__":
  entry()
