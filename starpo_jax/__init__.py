"""starpo-jax: StarPO multi-turn RL for LLM agents, compiled in JAX."""

import os

from jax._src import hardware_utils

__version__ = "0.1.0"

# libtpu, installed with the test requirements to compile for TPU
# topologies on any machine, starts when JAX first picks its backends and,
# on a machine without TPU chips, prints errors about TPU_WORKER_HOSTNAMES
# and the accelerator type before JAX falls back to the CPU or GPU. These
# two settings (only where no chip is attached and nothing set them) let it
# start quietly; a TPU VM is left as it is.
if hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0:
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")
