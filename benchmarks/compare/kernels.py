"""The update's two heaviest pieces beside PyTorch's, at the workload's
shapes: causal attention (``attention`` suite: ours against
``torch.nn.functional.scaled_dot_product_attention``) and the loss head
(``head`` suite: ``models.head`` against ``log_softmax`` of the output
layer's logits, the loss ``benchmarks.compare.pytorch`` takes), each
forward and forward with backward, one process each
(``benchmarks.compare.run``).

The attention's shapes are the update suite's minibatch (``rollout.batch /
algo.minibatches`` rows of ``rollout.max_context`` tokens) with the
model's heads; the head's, its generated tokens (``rollout.max_generated``
a row) over the model's vocabulary. Inputs are random, seeded, the same
on both sides (NumPy draws them).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.compare.rows import Measured, torch_rate
from benchmarks.compare.workload import Pair, Timing, timed_together
from starpo_jax.models import attention, head

PASSES = ("forward", "forward+backward")


def attention_shape(pair: Pair) -> tuple[int, int, int, int, int]:
  """``(B, T, N, K, H)`` of the update's minibatch attention."""
  r, cfg = pair.setup.config.rollout, pair.model_cfg
  rows = r.batch // pair.setup.config.algo.minibatches
  return rows, r.max_context, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim


def head_shape(pair: Pair) -> tuple[int, int, int]:
  """``(tokens, D, V)`` of the update's minibatch loss head."""
  r, cfg = pair.setup.config.rollout, pair.model_cfg
  rows = r.batch // pair.setup.config.algo.minibatches
  return rows * r.max_generated, cfg.hidden_size, cfg.vocab_size


def _attention_inputs(pair: Pair) -> list[np.ndarray]:
  b, t, n, k, h = attention_shape(pair)
  rng = np.random.default_rng(0)
  draw = lambda heads: rng.standard_normal((b, t, heads, h), np.float32)
  return [draw(n), draw(k), draw(k), draw(n)]  # q, k, v, and a cotangent


def _head_inputs(pair: Pair) -> list[np.ndarray]:
  n, d, v = head_shape(pair)
  rng = np.random.default_rng(0)
  tied = pair.model_cfg.tie_embeddings
  w_shape = (v, d) if tied else (d, v)
  return [
    rng.standard_normal((n, d), np.float32),
    (0.05 * rng.standard_normal(w_shape)).astype(np.float32),
    rng.integers(0, v, n).astype(np.int32),
    rng.standard_normal((2, n)).astype(np.float32),  # cotangents
  ]


def _workload(pair: Pair, suite: str) -> str:
  if suite == "attention":
    b, t, n, k, h = attention_shape(pair)
    return (
      f"{pair.name} attention, causal: {b} x {t} tokens, {n} heads "
      f"({k} kv) of {h}"
    )
  n, d, v = head_shape(pair)
  return f"{pair.name} loss head: {n} tokens x {d} -> vocabulary {v}"


def _jax_attention(pair: Pair):
  q, k, v, g = (jnp.asarray(x, pair.dtype) for x in _attention_inputs(pair))
  fn = lambda q, k, v: attention.causal(q, k, v, pair.model_cfg.attention)
  grad = jax.jit(lambda q, k, v, g: jax.vjp(fn, q, k, v)[1](g))
  return {
    "forward": lambda: jax.block_until_ready(jax.jit(fn)(q, k, v)),
    "forward+backward": lambda: jax.block_until_ready(grad(q, k, v, g)),
  }


def _jax_head(pair: Pair):
  h, w, t, g = _head_inputs(pair)
  h, w, t, g = jnp.asarray(h), jnp.asarray(w), jnp.asarray(t), jnp.asarray(g)
  cfg, algo = pair.model_cfg, pair.setup.config.algo
  temperature = pair.setup.config.rollout.temperature
  allowed = None if pair.allowed is None else jnp.asarray(pair.allowed)
  fn = lambda h, w: head.logprobs(
    h, w, t, temperature, allowed, cfg.tie_embeddings, algo.logits_chunk
  )
  grad = jax.jit(lambda h, w: jax.vjp(fn, h, w)[1]((g[0], g[1])))
  forward = jax.jit(fn)
  return {
    "forward": lambda: jax.block_until_ready(forward(h, w)),
    "forward+backward": lambda: jax.block_until_ready(grad(h, w)),
  }


def _row(pair: Pair, suite: str, name: str, t: Timing) -> dict[str, Any]:
  return dict(
    suite=suite,
    workload=f"{_workload(pair, suite)}, {name}",
    metric="tokens/s",
    jax=_tokens(pair, suite) / t.seconds,
    compile_s=t.first - t.seconds,
    peak_gib=t.peak_gib,
    recompiled=t.recompiled,
  )


def jax_side(suite: str):
  """The suite's JAX side: ``(pair, peak) -> Measured`` per pass."""
  build = _jax_attention if suite == "attention" else _jax_head

  def measured(pair: Pair, peak: Any) -> list[Measured]:
    del peak
    calls = build(pair)
    return [
      Measured(calls[name], lambda t, name=name: _row(pair, suite, name, t))
      for name in PASSES
    ]

  return measured


def torch_side(suite: str):
  """The suite's PyTorch side: ``(pair, repeats) -> [rate]`` per pass
  (``rows.torch_rate``)."""

  def rates(pair: Pair, repeats: int) -> list[dict[str, Any]]:
    build = _torch_attention if suite == "attention" else _torch_head
    calls = build(pair)
    out = []
    for name in PASSES:
      (t,) = timed_together([calls[name]], repeats)
      out.append(
        torch_rate(
          TORCH_LABELS[suite],
          _tokens(pair, suite) / t.seconds,
          t,
          f"{_workload(pair, suite)}, {name}",
        )
      )
    return out

  return rates


def _tokens(pair: Pair, suite: str) -> float:
  """The tokens one call of the suite computes (its figure's unit)."""
  if suite == "attention":
    return float(np.prod(attention_shape(pair)[:2]))
  return float(head_shape(pair)[0])


TORCH_LABELS = {
  "attention": "scaled_dot_product_attention",
  "head": "log_softmax of the logits (torch_baseline)",
}


def _torch_attention(pair: Pair):
  import torch

  dtype = getattr(torch, pair.dtype)
  heads_first = lambda x: torch.as_tensor(x).to(dtype).transpose(1, 2)
  q, k, v, g = (heads_first(x) for x in _attention_inputs(pair))
  sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
    q, k, v, is_causal=True, enable_gqa=True
  )

  def forward():
    with torch.no_grad():
      sdpa(q, k, v)

  def backward():
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    torch.autograd.grad(sdpa(*leaves), leaves, g)

  return {"forward": forward, "forward+backward": backward}


def _torch_head(pair: Pair):
  import torch

  from benchmarks.compare.pytorch.config import token_logprobs

  h, w, t, g = (torch.as_tensor(x) for x in _head_inputs(pair))
  tied = pair.model_cfg.tie_embeddings
  temperature = pair.setup.config.rollout.temperature
  allowed = None if pair.allowed is None else torch.as_tensor(pair.allowed)

  def loss(h, w):
    logits = h @ (w.T if tied else w)
    return token_logprobs(logits, t.long(), temperature, allowed)

  def forward():
    with torch.no_grad():
      loss(h, w)

  def backward():
    leaves = [x.detach().requires_grad_() for x in (h, w)]
    logp, entropy = loss(*leaves)
    torch.autograd.grad((logp, entropy), leaves, (g[0], g[1]))

  return {"forward": forward, "forward+backward": backward}
