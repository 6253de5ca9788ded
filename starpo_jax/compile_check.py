"""``python -m starpo_jax.compile_check`` (installed: ``starpo-compile-
check``): compiles the step for a mesh (``starpo_jax.cli.compile_check``)."""

from starpo_jax.cli.compile_check import entry

if __name__ == "__main__":
  entry()
