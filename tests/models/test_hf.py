"""Checkpoint import/export: shards, clear errors, memory, the verify CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from starpo_jax.models import hf, presets, transformer
from tests.models.conftest import VOCAB, torch_logits


def copy(src: str, dst) -> str:
  shutil.copytree(src, dst)
  return str(dst)


def test_sharded_export_round_trips_through_its_index(qwen2_dir, tmp_path):
  model = hf.load(qwen2_dir)
  hf.save(model, str(tmp_path), max_shard_bytes=40_000)
  files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
  assert len(files) > 2
  with open(tmp_path / "model.safetensors.index.json") as f:
    index = json.load(f)
  assert set(index["weight_map"].values()) == set(files)
  assert set(index["weight_map"]) == set(hf.tensor_names(model.cfg))
  tokens = np.arange(24).reshape(2, 12) % VOCAB
  reloaded = np.asarray(hf.load(str(tmp_path))(jnp.asarray(tokens))[0])
  np.testing.assert_allclose(
    reloaded, torch_logits(str(tmp_path), tokens), atol=1e-4
  )


def test_bfloat16_checkpoint_loads_into_float32_parameters(qwen2_dir, tmp_path):
  model = hf.load(qwen2_dir)
  hf.save(model, str(tmp_path), dtype="bfloat16")
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["torch_dtype"] == "bfloat16"
  reloaded = hf.load(str(tmp_path), param_dtype="float32")
  assert reloaded.embed[...].dtype == jnp.float32
  np.testing.assert_allclose(
    np.asarray(reloaded.embed[...]),
    np.asarray(model.embed[...]),
    rtol=1e-2,
    atol=1e-2,
  )


def _rewrite_tensors(path: str, edit) -> None:
  file = os.path.join(path, "model.safetensors")
  tensors = load_file(file)
  edit(tensors)
  save_file(tensors, file, metadata={"format": "pt"})


def _edit_config(path: str, **changes) -> None:
  file = os.path.join(path, "config.json")
  with open(file) as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(file, "w") as f:
    json.dump(cfg, f)


def _truncate(path: str) -> None:
  file = os.path.join(path, "model.safetensors")
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) - 100)


def _only_pickle(path: str) -> None:
  os.remove(os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "pytorch_model.bin"), "wb") as f:
    f.write(b"\x80\x04not really a pickle")


def _index_with_missing_shard(path: str) -> None:
  os.rename(
    os.path.join(path, "model.safetensors"),
    os.path.join(path, "model-00001-of-00002.safetensors"),
  )
  names = load_file(os.path.join(path, "model-00001-of-00002.safetensors"))
  weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
  weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": weight_map}, f)


BROKEN = {
  "missing config": (
    lambda p: os.remove(os.path.join(p, "config.json")),
    r"config\.json: missing",
  ),
  "unsupported architecture": (
    lambda p: _edit_config(p, architectures=["GPT2LMHeadModel"]),
    r"config\.json: architectures \['GPT2LMHeadModel'\] is not supported",
  ),
  "missing tensor": (
    lambda p: _rewrite_tensors(
      p, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")
    ),
    r"tensor model\.layers\.1\.mlp\.up_proj\.weight is missing",
  ),
  "unexpected tensor": (
    lambda p: _rewrite_tensors(
      p, lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)})
    ),
    r"model\.safetensors: unexpected tensor model\.extra\.weight",
  ),
  "shape mismatch": (
    lambda p: _edit_config(p, intermediate_size=128),
    r"model\.safetensors: tensor model\.layers\.0\.mlp\.gate_proj\.weight has "
    r"shape \(96, 64\), expected \(128, 64\)",
  ),
  "integer weights": (
    lambda p: _rewrite_tensors(
      p,
      lambda t: t.update(
        {"model.norm.weight": t["model.norm.weight"].astype(np.int32)}
      ),
    ),
    r"model\.safetensors: tensor model\.norm\.weight has dtype int32",
  ),
  "truncated file": (
    _truncate,
    r"model\.safetensors: truncated: tensor \S+ ends at data byte",
  ),
  "pickle only": (_only_pickle, r"no \*\.safetensors file \(pickled"),
  "missing shard": (
    _index_with_missing_shard,
    r"model-00002-of-00002\.safetensors: missing \(listed in",
  ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_checkpoints_fail_with_errors_naming_the_file_or_tensor(
  case, qwen2_dir, tmp_path
):
  path = copy(qwen2_dir, tmp_path / "ckpt")
  breaks, message = BROKEN[case]
  breaks(path)
  with pytest.raises(hf.CheckpointError, match=message):
    hf.load(path)


def test_missing_directory_is_named(tmp_path):
  with pytest.raises(hf.CheckpointError, match="nowhere: no such directory"):
    hf.load(str(tmp_path / "nowhere"))


def test_verify_command_reports_a_small_logit_difference(qwen2_dir):
  out = subprocess.run(
    [sys.executable, "-m", "starpo_jax.hf", "verify", qwen2_dir],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  diff = float(out.split("max_abs_logit_diff:")[1].split()[0])
  assert diff < 1e-4
  assert "top1_agreement: 1.0" in out


def test_verify_command_exits_with_the_error_for_a_bad_checkpoint(tmp_path):
  result = subprocess.run(
    [sys.executable, "-m", "starpo_jax.hf", "verify", str(tmp_path)],
    capture_output=True,
    text=True,
  )
  assert result.returncode == 1
  assert "config.json: missing" in result.stderr


_MEASURE = textwrap.dedent(
  """
  import sys, threading, time
  from starpo_jax.models import hf

  def anon_kib():
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("RssAnon:"):
          return int(line.split()[1])

  peak, stop = [0], False
  def sample():
    while not stop:
      peak[0] = max(peak[0], anon_kib())
      time.sleep(0.002)

  import jax, jax.numpy as jnp
  jnp.zeros(1).block_until_ready()
  base = anon_kib()
  thread = threading.Thread(target=sample)
  thread.start()
  model = hf.load(sys.argv[1])
  jax.block_until_ready(jax.tree.leaves(model))
  stop = True
  thread.join()
  print((peak[0] - base) * 1024)
  """
)


def test_loading_makes_no_second_full_copy_in_host_memory(tmp_path):
  # The shape of Qwen2.5-0.5B, cut to 4 layers to keep the test short: the
  # 151,936 x 896 embedding dominates, as in the full model.
  cfg = presets.preset("qwen2.5-0.5b", num_layers=4, param_dtype="bfloat16")
  model = transformer.create(cfg)
  hf.save(model, str(tmp_path))
  param_bytes = cfg.num_params() * 2
  del model
  growth = int(
    subprocess.run(
      [sys.executable, "-c", _MEASURE, str(tmp_path)],
      capture_output=True,
      text=True,
      check=True,
    ).stdout
  )
  # Anonymous memory (the file's mapped pages excluded) grows by about the
  # parameters; a second full copy would double it.
  assert growth < 1.3 * param_bytes, (growth, param_bytes)
