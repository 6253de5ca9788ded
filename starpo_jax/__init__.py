"""starpo-jax: StarPO multi-turn RL for LLM agents, compiled in JAX."""

__version__ = "0.1.0"
