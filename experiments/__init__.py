"""Reports on training runs: what an agent learns, not how fast. The
tables over runs' metrics and evaluations, the random valid player, the
learning curves, the run recipes (``*.sh``) and the renderer of the docs'
tables (``doc_tables``).

Like the library's commands, these let libtpu start quietly where no TPU
chip is attached.
"""

from starpo_jax.cli.app import quiet_libtpu

quiet_libtpu()
