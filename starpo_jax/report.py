"""``python -m starpo_jax.report`` (installed: ``starpo-report``): renders
runs' curves (``starpo_jax.cli.report``)."""

from starpo_jax.cli.report import entry

if __name__ == "__main__":
  entry()
