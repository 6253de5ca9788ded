"""Plain-Python references, independent of the JAX code they check:
RAGEN's environment rules, its prompt and answer grammar, and the advantage
estimators written as loops from their papers. Tests and benchmarks both
import them; nothing in ``starpo_jax`` or ``envs`` does."""
