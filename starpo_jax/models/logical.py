"""Logical axis names of parameters and activations, in one place.

Model code names these; ``config.logical_axis_rules`` maps them to mesh axes
(``starpo_jax/sharding.py``). No mesh axis is named in model code.
"""

LAYERS = "layers"  # stacked decoder layers
VOCAB = "vocab"
EMBED = "embed"  # the model (hidden) dimension
MLP = "mlp"  # the feed-forward hidden dimension
HEADS = "heads"  # query heads
KV = "kv"  # key/value heads
HEAD_DIM = "head_dim"

ALL = (LAYERS, VOCAB, EMBED, MLP, HEADS, KV, HEAD_DIM)
