"""The PyTorch baseline's generation loops (``starpo.py`` plays the
episodes): ``"dynamic"``, ``model.generate`` with its default dynamic cache
re-reading each episode's history every turn (RAGEN with a Hugging Face
rollout), and ``"static"``, one preallocated ``StaticCache`` per episode
that each turn only extends, its one-token decoding optionally through
``torch.compile``."""

from __future__ import annotations

from typing import Any

import torch
import transformers

from benchmarks.compare.pytorch.config import Clock, Config, token_logprobs
from starpo_jax.models.tokenizer import Tokenizer


class _OnlyAllowed(transformers.LogitsProcessor):
  def __init__(self, allowed: torch.Tensor):
    self.allowed = allowed

  def __call__(self, input_ids, scores):
    return scores.masked_fill(~self.allowed, float("-inf"))


class Generator:
  """One turn of generation for a list of episodes (see module docstring)."""

  def __init__(
    self,
    model: Any,
    tok: Tokenizer,
    cfg: Config,
    allowed: torch.Tensor | None,
    kind: str = "dynamic",
    compile: bool = False,
    clock: Clock | None = None,
  ):
    if kind not in ("dynamic", "static"):
      raise ValueError(f"generator kind {kind!r}; expected dynamic or static")
    self.model, self.tok, self.cfg, self.allowed = model, tok, cfg, allowed
    self.kind = kind
    self.device = next(model.parameters()).device
    self.clock = clock or Clock(self.device)
    self.stop_ids = set(tok.stop_ids)
    close = tok.token_to_id("</answer>")
    if close is not None:
      self.stop_ids.add(close)
    self.pad = tok.eos_id
    self._decode = model.forward
    if compile:
      self._decode = torch.compile(model.forward, dynamic=False)
    self._cache = self._valid = self._next_pos = self._pending = None
    self._length = 0

  def start(self, batch: int, max_len: int) -> None:
    """A new rollout of ``batch`` episodes, ``max_len`` tokens each at most."""
    if self.kind == "static":
      self._cache = transformers.StaticCache(
        config=self.model.config, max_cache_len=max_len
      )
      d = self.device
      self._valid = torch.zeros(batch, max_len, dtype=torch.long, device=d)
      self._next_pos = torch.zeros(batch, dtype=torch.long, device=d)
      self._length = 0
      self._pending = None

  def _sample(self, logits: torch.Tensor, gen: torch.Generator):
    t = self.cfg.temperature or 1.0
    z = logits.float() / t
    if self.allowed is not None:
      z = z.masked_fill(~self.allowed, float("-inf"))
    logp_all = torch.log_softmax(z, -1)
    if self.cfg.temperature == 0:
      tok = logp_all.argmax(-1)
    else:
      # Gumbel-max: an exact sample, with host random numbers on any device.
      u = torch.rand(logp_all.shape, generator=gen).to(self.device)
      tok = (logp_all - torch.log(-torch.log(u.clamp(min=1e-20)))).argmax(-1)
    return tok, logp_all.gather(-1, tok[:, None])[:, 0]

  @torch.no_grad()
  def __call__(
    self,
    rows: list[int],
    contexts: list[list[int]],
    prompts: list[list[int]],
    gen: torch.Generator,
  ) -> tuple[list[list[int]], list[list[float]]]:
    """Responses and their log-probabilities for episodes ``rows``."""
    if self.kind == "dynamic":
      with self.clock("generate (prefill, decode, sampling)"):
        return self._dynamic(contexts, gen)
    return self._static(rows, prompts, gen)

  def _dynamic(self, contexts, gen):
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), self.pad, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, c in enumerate(contexts):
      ids[i, width - len(c) :] = torch.tensor(c)
      attention[i, width - len(c) :] = 1
    processors = transformers.LogitsProcessorList(
      [_OnlyAllowed(self.allowed)] if self.allowed is not None else []
    )
    torch.manual_seed(int(torch.randint(1 << 31, (), generator=gen)))
    out = self.model.generate(
      input_ids=ids.to(self.device),
      attention_mask=attention.to(self.device),
      do_sample=self.cfg.temperature > 0,
      temperature=self.cfg.temperature or 1.0,
      top_k=0,
      top_p=1.0,
      max_new_tokens=self.cfg.max_new_tokens,
      eos_token_id=sorted(self.stop_ids),
      pad_token_id=self.pad,
      logits_processor=processors,
      return_dict_in_generate=True,
      output_logits=True,
    )
    new = out.sequences[:, width:]
    logits = torch.stack(out.logits, 1)[:, : new.shape[1]]
    logp, _ = token_logprobs(
      logits.float(), new, self.cfg.temperature, self.allowed
    )
    return self._cut(new, logp)

  def _cut(self, new: torch.Tensor, logp: torch.Tensor):
    """Responses up to and including their first stop token."""
    responses, logps = [], []
    for row, lp in zip(new.tolist(), logp.tolist(), strict=True):
      end = len(row)
      for k, t in enumerate(row):
        if t in self.stop_ids:
          end = k + 1
          break
      responses.append(row[:end])
      logps.append(lp[:end])
    return responses, logps

  def _forward(self, ids, positions, fn):
    start = self._length
    out = fn(
      input_ids=ids,
      position_ids=positions,
      attention_mask=self._valid,
      past_key_values=self._cache,
      cache_position=torch.arange(
        start, start + ids.shape[1], device=self.device
      ),
      use_cache=True,
    )
    self._length += ids.shape[1]
    return out.logits[:, -1]

  def _static(self, rows, prompts, gen):
    # Every episode of the rollout stays in the batch (static shapes); the
    # ones not playing this turn only have their slots masked out. The
    # previous turn's last sampled token enters the cache with this prompt.
    with self.clock("prefill"):
      logits, live = self._prefill(rows, prompts)
    return self._decode_turn(rows, live, logits, gen)

  def _prefill(self, rows, prompts):
    """The turn's prompts of episodes ``rows`` into their caches: the
    logits of their next tokens, and which rows play the turn."""
    b = self._valid.shape[0]
    d = self.device
    live = torch.zeros(b, dtype=torch.bool, device=d)
    live[rows] = True
    width = max(len(p) for p in prompts)
    ids = torch.full((b, width), self.pad, dtype=torch.long, device=d)
    pos = self._next_pos[:, None].expand(b, width).clone()
    start = self._length + (self._pending is not None)
    for r, p in zip(rows, prompts, strict=True):
      ids[r, width - len(p) :] = torch.tensor(p, device=d)
      self._valid[r, start + width - len(p) : start + width] = 1
      pos[r, width - len(p) :] = self._next_pos[r] + torch.arange(
        len(p), device=d
      )
      self._next_pos[r] += len(p)
    if self._pending is not None:
      tok, tok_pos = self._pending
      ids = torch.cat([tok[:, None], ids], 1)
      pos = torch.cat([tok_pos, pos], 1)
    return self._forward(ids, pos, self.model.forward), live

  def _decode_turn(self, rows, live, logits, gen):
    """Samples the replies of episodes ``rows`` token by token."""
    d, clock = self.device, self.clock
    finished = ~live
    stops = torch.tensor(sorted(self.stop_ids), device=d)
    out_tokens, out_logp = [], []
    for k in range(self.cfg.max_new_tokens):
      with clock("decode: sample"):
        tok, lp = self._sample(logits, gen)
      with clock("decode: writes, stops"):
        tok = torch.where(finished, self.pad, tok)
        out_tokens.append(tok)
        out_logp.append(lp)
        self._valid[:, self._length] = (~finished).long()
        pos = self._next_pos[:, None].clone()
        self._next_pos += (~finished).long()
        finished = finished | torch.isin(tok, stops)
        last = bool(finished.all()) or k == self.cfg.max_new_tokens - 1
      if last:
        self._pending = (tok, pos)
        break
      with clock("decode: forward"):
        logits = self._forward(tok[:, None], pos, self._decode)
    with clock("decode: writes, stops"):
      new = torch.stack(out_tokens, 1)[rows]
      logp = torch.stack(out_logp, 1)[rows]
      return self._cut(new, logp)
