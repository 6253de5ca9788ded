"""Tunix (``google-tunix``), the JAX peer, in its own virtual environment
(``requirements.txt`` beside this file)."""
