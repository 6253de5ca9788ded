"""``python -m starpo_jax.evaluate`` (installed: ``starpo-evaluate``):
evaluates a policy on held-out levels (``starpo_jax.cli.evaluate``)."""

from starpo_jax.cli.evaluate import entry

if __name__ == "__main__":
  entry()
