"""``python -m starpo_jax.compile_check``: see ``starpo_jax.cli``."""

import runpy

if __name__ == "__main__":
  runpy.run_module(
    "starpo_jax.cli.compile_check", run_name="__main__", alter_sys=True
  )
