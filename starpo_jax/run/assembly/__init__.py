"""A run assembled from its config, in parts by what they build:

* ``config``: the config parsed once into the typed ``RunConfig``
  (``parse``), saved and loaded with a run (``to_json``, ``load_config``);
* ``setup``: environments, tokenizer, model architecture, codecs, mesh
  (``build`` -> ``Setup``);
* ``state``: the models' definitions and optimizers (``make_learner``),
  the train state created sharded (``init_state``);
* ``compiled``: the jitted RL and warm-start steps, the abstract state
  for ahead-of-time compiles;
* ``restore``: policies from checkpoints (``load_policy``,
  ``policy_from``).

Everything is checked on the host before anything compiles; a setting
that cannot work raises ``ConfigError`` naming it.
"""

from starpo_jax.run.assembly.compiled import (
  abstract_state,
  compile_sft_step,
  compile_step,
  step_spec,
)
from starpo_jax.run.assembly.config import (
  CONFIG_FILE,
  ConfigError,
  changed_settings,
  load_config,
  parse,
  to_json,
)
from starpo_jax.run.assembly.restore import (
  base_of,
  final_params,
  load_policy,
  policy_from,
)
from starpo_jax.run.assembly.setup import Setup, build
from starpo_jax.run.assembly.state import (
  init_state,
  initial_policy,
  keeps_reference,
  make_learner,
  optimizer_state,
  policy_optimizer_state,
)

__all__ = [
  "CONFIG_FILE",
  "ConfigError",
  "Setup",
  "abstract_state",
  "base_of",
  "build",
  "changed_settings",
  "compile_sft_step",
  "compile_step",
  "final_params",
  "init_state",
  "initial_policy",
  "keeps_reference",
  "load_config",
  "load_policy",
  "make_learner",
  "optimizer_state",
  "parse",
  "policy_from",
  "policy_optimizer_state",
  "step_spec",
  "to_json",
]
