"""``python -m starpo_jax.evaluate``: runs ``starpo_jax.cli.evaluate``."""

import runpy

if __name__ == "__main__":
  runpy.run_module(
    "starpo_jax.cli.evaluate", run_name="__main__", alter_sys=True
  )
