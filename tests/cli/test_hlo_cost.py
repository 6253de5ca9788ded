"""The compiled program's cost with loops counted as they run, against
counts by hand (2*m*n*k a matmul) and against XLA's own count where the
program has no loop."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from starpo_jax.cli import hlo_cost, hlo_text

B, D = 8, 64
MATMUL = 2 * B * D * D  # one [B, D] @ [D, D]


def cost_of(fn, *args, **kwargs) -> hlo_cost.Cost:
  compiled = jax.jit(fn).lower(*args).compile()
  return hlo_cost.program_cost(compiled.as_text(), **kwargs)


def loops(x, w):
  def body(c, _):
    return c @ w, None

  c, _ = jax.lax.scan(body, x, None, length=7)
  return jax.lax.fori_loop(0, 5, lambda i, c: c @ w, c)


def test_loops_count_every_trip_where_xla_counts_one():
  x, w = jnp.ones((B, D)), jnp.ones((D, D))
  cost = cost_of(loops, x, w)
  assert cost.total_flops == pytest.approx(12 * MATMUL, rel=0.01)
  assert not cost.unbounded_loops
  xla = jax.jit(loops).lower(x, w).compile().cost_analysis()["flops"]
  assert xla < 3 * MATMUL  # each body once: why this module exists


def test_counted_loops_are_read_off_their_condition_without_annotation():
  # XLA's TPU programs carry no known_trip_count: the count must come from
  # the loop itself (condition i < N, i from a constant, body i + 1).
  x, w = jnp.ones((B, D)), jnp.ones((D, D))
  text = jax.jit(loops).lower(x, w).compile().as_text()
  bare = re.sub(r',"known_trip_count":\{"n":"\d+"\}', "", text)
  assert "known_trip_count" not in bare
  cost = hlo_cost.program_cost(bare)
  assert cost.total_flops == pytest.approx(12 * MATMUL, rel=0.01)
  assert not cost.unbounded_loops


def test_phases_are_the_named_scopes():
  def fn(x, w, v):
    with jax.named_scope("alpha"):
      a = x @ w
    with jax.named_scope("beta"):
      b = jax.lax.scan(lambda c, _: (c @ v, None), a, None, length=3)[0]
    return b

  x, w, v = jnp.ones((B, D)), jnp.ones((D, 2 * D)), jnp.ones((2 * D, 2 * D))
  cost = cost_of(fn, x, w, v, phases=("alpha", "beta"))
  assert cost.flops["alpha"] == pytest.approx(2 * B * D * 2 * D, rel=0.01)
  assert cost.flops["beta"] == pytest.approx(3 * 2 * B * (2 * D) ** 2, rel=0.01)


def data_dependent_loop(x, w):
  return jax.lax.while_loop(
    lambda c: jnp.sum(c[0]) < 1e30, lambda c: (c[0] @ w, c[1] + 1), (x, 0)
  )[0]


def data_dependent(x, w):
  with jax.named_scope("decode"):
    return data_dependent_loop(x, w)


def test_a_loop_without_trip_count_takes_its_scopes_bound():
  x, w = jnp.ones((B, D)), jnp.ones((D, D))
  bounded = cost_of(data_dependent, x, w, bounds={"decode": 9})
  assert bounded.total_flops == pytest.approx(9 * MATMUL, rel=0.05)
  assert not bounded.unbounded_loops
  unbounded = cost_of(data_dependent, x, w)
  assert unbounded.total_flops == pytest.approx(MATMUL, rel=0.05)
  assert len(unbounded.unbounded_loops) == 1
  assert "decode" in unbounded.unbounded_loops[0]


def test_a_loop_takes_its_innermost_scopes_bound():
  # The attention's block loop inside the decode loop runs the block
  # count each token, not the token count.
  def nested(x, w):
    def token(c):
      with jax.named_scope("kv_blocks"):
        inner = data_dependent_loop(c[0], w)
      return inner, c[1] + 1

    with jax.named_scope("decode"):
      return jax.lax.while_loop(lambda c: c[1] < c[0][0, 0], token, (x, 0))[0]

  x, w = jnp.ones((B, D)), jnp.ones((D, D))
  cost = cost_of(nested, x, w, bounds={"decode": 9, "kv_blocks": 4})
  assert cost.total_flops == pytest.approx(9 * 4 * MATMUL, rel=0.05)


def test_a_conditional_counts_its_dearer_branch():
  def fn(p, x, w):
    return jax.lax.cond(p, lambda: (x @ w) @ w, lambda: x)

  x, w = jnp.ones((B, D)), jnp.ones((D, D))
  cost = cost_of(fn, jnp.array(True), x, w)
  assert cost.total_flops == pytest.approx(2 * MATMUL, rel=0.05)


def test_bytes_and_flops_match_xla_without_loops():
  def fn(x, w):
    return jnp.tanh(x @ w) * 2.0 + 1.0

  x, w = jnp.ones((64, 256)), jnp.ones((256, 128))
  compiled = jax.jit(fn).lower(x, w).compile()
  xla = compiled.cost_analysis()
  cost = hlo_cost.program_cost(compiled.as_text())
  assert cost.total_flops == pytest.approx(xla["flops"], rel=0.01)
  assert cost.total_bytes == pytest.approx(xla["bytes accessed"], rel=0.01)


def test_roofline_takes_each_phases_slower_limit():
  cost = hlo_cost.Cost(
    flops={"a": 10.0, "b": 1.0}, bytes={"a": 1.0, "b": 100.0}
  )
  # a: compute-bound (10 / 10), b: memory-bound (100 / 50).
  assert cost.roofline_seconds(10.0, 50.0) == pytest.approx(1.0 + 2.0)


def test_sizes_of_types():
  assert hlo_text.elements("(f32[2,3]{1,0}, s32[])") == 7
  assert hlo_text.size_bytes("(bf16[4,8]{1,0}, pred[3])") == 4 * 8 * 2 + 3


def test_an_update_in_place_moves_the_slice_not_the_buffer():
  def fn(buf, u, i):
    return jax.lax.dynamic_update_slice(buf, u * 2.0, (i, 0))

  buf, u = jnp.ones((1024, 1024)), jnp.ones((1, 1024))
  compiled = jax.jit(fn, donate_argnums=0).lower(buf, u, 3).compile()
  cost = hlo_cost.program_cost(compiled.as_text())
  # Reads the row and the index, writes the row (XLA's count too).
  assert cost.total_bytes == 4 * 1024 + 4 + 4 * 1024
  assert cost.total_bytes == compiled.cost_analysis()["bytes accessed"]


def test_a_sliced_operand_reads_the_slice():
  def fn(buf, i):
    return jax.lax.dynamic_slice(buf, (i, 0), (2, 1024)) * 3.0

  buf = jnp.ones((1024, 1024))
  compiled = jax.jit(fn).lower(buf, 5).compile()
  cost = hlo_cost.program_cost(compiled.as_text())
  # Reads two rows and the index, writes two rows.
  assert cost.total_bytes == 4 * 2 * 1024 * 2 + 4
  assert cost.total_bytes == compiled.cost_analysis()["bytes accessed"]


@pytest.mark.parametrize(
  "window",
  [
    dict(window_strides=(1,), padding="SAME"),
    dict(window_strides=(2,), padding=((3, 1),), rhs_dilation=(2,)),
    # A transposed convolution: holes between the input's elements.
    dict(window_strides=(1,), padding=((2, 2),), lhs_dilation=(3,)),
  ],
)
def test_convolution_flops_match_xla(window):
  # XLA's TPU programs hold their matmuls as convolutions; XLA's own count
  # (loop-free program) is the reference, windows with padding, strides
  # and dilations included, in feature groups.
  def fn(x, w):
    return jax.lax.conv_general_dilated(x, w, feature_group_count=2, **window)

  x, w = jnp.ones((4, 6, 37)), jnp.ones((10, 3, 5))
  compiled = jax.jit(fn).lower(x, w).compile()
  assert "convolution(" in compiled.as_text()
  cost = hlo_cost.program_cost(compiled.as_text())
  assert cost.total_flops == pytest.approx(
    compiled.cost_analysis()["flops"], rel=1e-6
  )


def tpu_program(fn, *shapes) -> str:
  """``fn`` compiled for one TPU v5e chip (libtpu, a test dependency,
  compiles for chips this machine does not have)."""
  from jax.experimental import topologies

  topology = topologies.get_topology_desc(
    platform="tpu", topology_name="v5e:1x1", chips_per_host_bounds=[1, 1, 1]
  )
  mesh = jax.sharding.Mesh(topology.devices, ("x",))
  one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=one) for s in shapes]
  return jax.jit(fn).lower(*args).compile().as_text()


def test_a_tpu_matmul_is_a_convolution_counted_as_one():
  text = tpu_program(lambda x, w: x @ w, (256, 512), (512, 384))
  assert "convolution(" in text and " dot(" not in text
  assert hlo_cost.program_cost(text).total_flops == 2 * 256 * 512 * 384


def test_splash_attention_kernels_are_counted_by_their_blocks():
  # XLA sees nothing inside a Pallas kernel. Causal attention over 8 x 8
  # blocks of 128 keeps the 36 on or below the diagonal; each runs 2
  # matmuls forward, 3 for dq and 4 for dk/dv, each 2 * 128 * 128 * D
  # FLOPs per head.
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as kernel,
  )
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as mask,
  )

  heads, length, dim = 4, 1024, 64

  def loss(q, k, v):
    causal = mask.MultiHeadMask(
      [mask.CausalMask((length, length)) for _ in range(heads)]
    )
    splash = kernel.make_splash_mha(causal, head_shards=1, q_seq_shards=1)
    return splash(q, k, v).astype(jnp.float32).sum()

  shape = (heads, length, dim)
  text = tpu_program(jax.grad(loss, argnums=(0, 1, 2)), shape, shape, shape)
  assert text.count('custom_call_target="tpu_custom_call"') == 3
  cost = hlo_cost.program_cost(text)
  assert cost.opaque_calls == 0
  attention = (2 + 3 + 4) * heads * 36 * 2 * 128 * 128 * dim
  outside = 2 * heads * length * dim  # the elementwise rest, far less
  assert attention <= cost.total_flops < attention + outside


def test_on_chip_buffers_and_async_copies_move_no_hbm_bytes_twice():
  # XLA's TPU programs prefetch into on-chip memory (layout S(1)) with a
  # copy-start/copy-done pair: the pair reads the 1 KiB once from HBM and
  # writes on chip; the negate reads on chip and writes 1 KiB to HBM.
  text = """HloModule m
ENTRY %main (p: f32[256]) -> f32[256] {
  %p = f32[256]{0} parameter(0)
  %cs = (f32[256]{0}, f32[256]{0:S(1)}, u32[]{:S(2)}) copy-start(%p)
  %cd = f32[256]{0:S(1)} copy-done(%cs)
  ROOT %n = f32[256]{0} negate(%cd)
}
"""
  cost = hlo_cost.program_cost(text)
  assert cost.total_bytes == 1024 + 1024
  assert cost.total_flops == 256


def test_an_operand_sliced_inside_a_nested_fusion_reads_the_slice():
  # XLA's TPU decode step passes all layers' stacked weights into a fusion
  # whose nested fusion slices out one layer: one row is read, not eight.
  text = """HloModule m
%inner (a: f32[8,64]) -> f32[1,64] {
  %a = f32[8,64]{1,0} parameter(0)
  %c = s32[] constant(2)
  %z = s32[] constant(0)
  ROOT %d = f32[1,64]{1,0} dynamic-slice(%a, %c, %z), dynamic_slice_sizes={1,64}
}
%outer (q: f32[8,64]) -> f32[1,64] {
  %q = f32[8,64]{1,0} parameter(0)
  %f = f32[1,64]{1,0} fusion(%q), kind=kLoop, calls=%inner
  ROOT %n = f32[1,64]{1,0} negate(%f)
}
ENTRY %main (x: f32[8,64]) -> f32[1,64] {
  %x = f32[8,64]{1,0} parameter(0)
  ROOT %o = f32[1,64]{1,0} fusion(%x), kind=kLoop, calls=%outer
}
"""
  cost = hlo_cost.program_cost(text)
  assert cost.total_bytes == 256 + 256
