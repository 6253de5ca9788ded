"""``python -m starpo_jax.main``: runs ``starpo_jax.cli.main``."""

import runpy

if __name__ == "__main__":
  runpy.run_module("starpo_jax.cli.main", run_name="__main__", alter_sys=True)
