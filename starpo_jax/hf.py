"""``python -m starpo_jax.hf``: runs ``starpo_jax.cli.hf``."""

import runpy

if __name__ == "__main__":
  runpy.run_module("starpo_jax.cli.hf", run_name="__main__", alter_sys=True)
