"""Speed, measured: this project beside its peers (``compare``), where a
step's time goes (``profiling``) and the parts on their own
(``components``). ``README.md`` beside this file maps each question to its
command.

The benchmarks are commands (``python -m benchmarks.compare.run``): like the
library's, they let libtpu start quietly where no TPU chip is attached.
"""

from starpo_jax.cli.app import quiet_libtpu

quiet_libtpu()
