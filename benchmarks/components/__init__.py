"""The step's parts on their own: the environments, the host bridge and
the compiled rollout."""
