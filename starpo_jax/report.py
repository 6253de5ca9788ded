"""``python -m starpo_jax.report``: runs ``starpo_jax.cli.report``."""

import runpy

if __name__ == "__main__":
  runpy.run_module("starpo_jax.cli.report", run_name="__main__", alter_sys=True)
