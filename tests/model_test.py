"""Transformer: KV-cached decoding equals the full pass, causality, key masking, stacked sets, the layer
norm's values and gradient."""
import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import model as model_lib

CFG = model_lib.ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=12)
B, T = 2, 10


@functools.cache
def _params():
  """Three parameter sets, built once (eager init dispatches op by op, and compiling takes seconds)."""
  # unsafe_rbg: the same initialisers with a generator that compiles in a fraction of threefry's time.
  key = jax.random.key(0, impl="unsafe_rbg")
  return jax.jit(model_lib.init_stack, static_argnums=(0, 2))(CFG, key, 3)


def _first(params_R):
  return jax.tree.map(lambda p: p[0], params_R)


def _tokens(seed=1):
  return jax.random.randint(jax.random.PRNGKey(seed), (B, T), 3, CFG.vocab_size)


def test_init_stack_shapes_and_float32():
  params_R = _params()
  chex.assert_shape(params_R["embed"]["embedding"], (3, CFG.vocab_size, CFG.d_model))
  chex.assert_shape(params_R["pos_embed"]["embedding"], (3, CFG.max_len, CFG.d_model))
  chex.assert_tree_all_finite(params_R)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params_R))
  # Sets are initialised independently, not copies of one another.
  assert not np.allclose(params_R["embed"]["embedding"][0], params_R["embed"]["embedding"][1])


def test_compute_dtype_is_float32_on_cpu():
  assert jax.default_backend() == "cpu"
  assert model_lib.compute_dtype("auto") == jnp.float32
  logits_BxTxV, cache = model_lib.apply(CFG, _first(_params()), _tokens(), 0, jnp.ones((B, T), bool))
  chex.assert_shape(logits_BxTxV, (B, T, CFG.vocab_size))
  assert logits_BxTxV.dtype == jnp.float32
  assert cache is None  # no cache in, no cache out


def test_cached_decoding_matches_full_forward():
  params = _first(_params())
  tokens_BxT = _tokens()
  # Some keys invalid (as PAD or hidden ones are), to check the mask is applied in both paths.
  key_ok_BxT = jnp.ones((B, T), bool).at[0, 2].set(False).at[1, 6].set(False)
  full_BxTxV, _ = model_lib.apply(CFG, params, tokens_BxT, 0, key_ok_BxT)

  prefill = 4
  cache = model_lib.empty_cache(CFG, B, T)
  chex.assert_shape(cache[0]["k"], (B, T, CFG.n_heads, CFG.d_model // CFG.n_heads))
  step = jax.jit(model_lib.apply, static_argnums=0)
  logits, cache = step(CFG, params, tokens_BxT[:, :prefill], 0, key_ok_BxT, cache)
  pieces = [logits]
  for t in range(prefill, T):  # one token at a time through the cache
    logits, cache = step(CFG, params, tokens_BxT[:, t:t + 1], t, key_ok_BxT, cache)
    pieces.append(logits)
  cached_BxTxV = jnp.concatenate(pieces, axis=1)
  chex.assert_trees_all_close(cached_BxTxV, full_BxTxV, atol=1e-5, rtol=1e-5)


def test_causality_through_gradients():
  """d logits[t] / d input embedding at t' is zero for t' > t and non-zero for t' <= t.

  Row p of the position table is added to the input at position p only, so the Jacobian with respect
  to that table is the Jacobian with respect to each position's input embedding.
  """
  params = _first(_params())
  tokens_1xT = _tokens()[:1]
  w_V = jax.random.normal(jax.random.PRNGKey(2), (CFG.vocab_size,))

  def out_T(pos_table):
    p = {**params, "pos_embed": {"embedding": pos_table}}
    logits_1xTxV, _ = model_lib.apply(CFG, p, tokens_1xT, 0, jnp.ones((1, T), bool))
    return logits_1xTxV[0] @ w_V

  jac_TxLxD = jax.jit(jax.jacobian(out_T))(params["pos_embed"]["embedding"])
  chex.assert_shape(jac_TxLxD, (T, CFG.max_len, CFG.d_model))
  influence_TxT = np.abs(np.asarray(jac_TxLxD)).sum(-1)[:, :T]
  future = np.triu(np.ones((T, T), bool), k=1)
  assert np.all(influence_TxT[future] == 0.0)
  assert np.all(influence_TxT[~future] > 0.0)
  assert np.all(np.asarray(jac_TxLxD)[:, T:] == 0.0)  # canvas slots past the input are unused


def test_masked_key_changes_nothing():
  params = _first(_params())
  tokens_BxT = _tokens()
  other_BxT = tokens_BxT.at[:, 3].set((tokens_BxT[:, 3] + 7) % CFG.vocab_size)
  masked_BxT = jnp.ones((B, T), bool).at[:, 3].set(False)
  run = jax.jit(lambda toks, ok: model_lib.apply(CFG, params, toks, 0, ok)[0])
  a, b = run(tokens_BxT, masked_BxT), run(other_BxT, masked_BxT)
  # Every other query ignores key 3 (position 3's own output still sees its own token embedding).
  keep = np.arange(T) != 3
  chex.assert_trees_all_close(a[:, keep], b[:, keep], atol=1e-6)
  # Control: with key 3 readable, the same change reaches every later position.
  ok = jnp.ones((B, T), bool)
  diff_BxT = jnp.abs(run(tokens_BxT, ok) - run(other_BxT, ok)).max(-1)
  assert np.all(diff_BxT[:, :3] == 0.0) and np.all(diff_BxT[:, 3:] > 1e-6)


def test_stacked_apply_vmap_equals_per_set_apply():
  params_R = _params()
  tokens_BxT = _tokens()
  ok_BxT = jnp.ones((B, T), bool)
  stacked_RxBxTxV, _ = jax.jit(jax.vmap(lambda p: model_lib.apply(CFG, p, tokens_BxT, 0, ok_BxT)))(params_R)
  chex.assert_shape(stacked_RxBxTxV, (3, B, T, CFG.vocab_size))
  for r in range(3):
    one = jax.tree.map(lambda p: p[r], params_R)
    expected_BxTxV, _ = model_lib.apply(CFG, one, tokens_BxT, 0, ok_BxT)
    chex.assert_trees_all_close(stacked_RxBxTxV[r], expected_BxTxV, atol=1e-5)
  # Different sets give different outputs (the vmap is over parameters, not a broadcast of one set).
  assert not np.allclose(stacked_RxBxTxV[0], stacked_RxBxTxV[1])


def test_flops_per_token_by_hand():
  # d_model 16, 2 layers, d_ff 32, 96 symbols, 10 keys; multiply-adds per layer: q, k, v, out 4 * 16^2 =
  # 1024, MLP 2 * 16 * 32 = 1024, attention q.k and att.v 2 * 10 * 16 = 320; unembedding 16 * 96 = 1536.
  cfg = model_lib.ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=24)
  assert cfg.flops_per_token(10) == 2 * (2 * (1024 + 1024 + 320) + 1536)


def test_a_whole_canvas_pass_in_causal_blocks_equals_one_over_every_key(monkeypatch):
  """Queries in blocks of 3 (`model.CAUSAL_CHUNK`), each reading the keys up to its block's end: the
  logits and their gradient are those of one pass over every key, with holes in the key mask and
  per-query masks alike; the cached decode (never in blocks) still matches it."""
  params = _first(_params())
  tokens_BxT = _tokens()
  key_ok_BxT = jnp.ones((B, T), bool).at[0, 2].set(False).at[1, 6].set(False)
  key_ok_BxTxT = jnp.broadcast_to(key_ok_BxT[:, None], (B, T, T)).at[:, 7, 4].set(False)
  logits = lambda p, ok: model_lib.apply(CFG, p, tokens_BxT, 0, ok)[0]
  loss = lambda p, ok: jnp.sum(logits(p, ok)[:, :, 5] ** 2)

  def run():  # traced anew: the block length is read when tracing
    return [jax.jit(f)(params, ok) for f in (logits, jax.grad(loss)) for ok in (key_ok_BxT, key_ok_BxTxT)]

  one_pass = run()
  monkeypatch.setattr(model_lib, "CAUSAL_CHUNK", 3)
  assert model_lib.causal_chunks(T) == [(0, 3), (3, 6), (6, 9), (9, 10)]
  in_blocks = run()
  chex.assert_trees_all_close(in_blocks, one_pass, atol=1e-5, rtol=1e-5)
  cache = model_lib.empty_cache(CFG, B, T)
  step = jax.jit(model_lib.apply, static_argnums=0)
  pieces = []
  for t in range(T):
    logits_Bx1xV, cache = step(CFG, params, tokens_BxT[:, t:t + 1], t, key_ok_BxT, cache)
    pieces.append(logits_Bx1xV)
  chex.assert_trees_all_close(jnp.concatenate(pieces, 1), in_blocks[0], atol=1e-5, rtol=1e-5)
  # Its FLOPs: each block's queries at the keys up to its end, 3 at 3, 6 and 9 keys, 1 at 10.
  assert CFG.whole_pass_flops(T) == sum(n * CFG.flops_per_token(k) for n, k in ((3, 3), (3, 6), (3, 9), (1, 10)))
  assert model_lib.SetStack.whole_pass_flops(CFG, T) == T * CFG.flops_per_token(T)  # a model without blocks


def test_count_params():
  params_R = _params()
  one = model_lib.count_params(_first(params_R))
  assert model_lib.count_params(params_R) == 3 * one
  D, V, L, F = CFG.d_model, CFG.vocab_size, CFG.max_len, CFG.d_ff
  block = 2 * 2 * D + 4 * (D * D + D) + (D * F + F) + (F * D + D)  # 2 LayerNorms, q/k/v/out, MLP
  assert one == V * D + L * D + CFG.n_layers * block + 2 * D + (D * V + V)


def test_take_sets_slices_a_run_of_sets_and_gathers_any_other_order():
  cfg = model_lib.ModelConfig(d_model=8, n_layers=1, d_ff=16, max_len=4)
  params_R = cfg.init_stack(jax.random.key(0), 3)
  for index in ([0, 1, 2], [1, 2], [2, 0], [1, 1]):
    index = np.array(index)
    taken = jax.jit(functools.partial(cfg.take_sets, index=index))(params_R)
    chex.assert_trees_all_equal(taken, jax.tree.map(lambda p, index=index: p[index], params_R))
  # A run in order is a slice: no gather in the forward pass, no scatter-add in the update's gradient.
  primitives = lambda index: {str(e.primitive) for e in jax.make_jaxpr(
      lambda p: cfg.take_sets(p, np.array(index)))(params_R).jaxpr.eqns}
  assert "gather" not in primitives([0, 1, 2]) | primitives([1, 2])
  assert "gather" in primitives([2, 0])


def test_layer_norm_gradient_by_hand():
  # x = (0, 1, 2): mean 1, variance 2/3, x_hat = (-a, 0, a) with a = sqrt(3/2).  With dy = (1, 0, 0) and
  # scale 1: g = dy, mean(g) = 1/3, mean(g x_hat) = -a/3, so dx = a (g - 1/3 + x_hat a/3)
  # = a (1 - 1/3 - 1/2, -1/3, 1/2 - 1/3) = a (1/6, -1/3, 1/6); d scale = dy x_hat, d bias = dy.
  a = np.sqrt(1.5)
  x, dy = jnp.array([[0.0, 1.0, 2.0]]), jnp.array([[1.0, 0.0, 0.0]])
  y, vjp = jax.vjp(lambda x, s, b: model_lib.layer_norm(x, s, b, 0.0), x, jnp.ones(3), jnp.zeros(3))
  np.testing.assert_allclose(y, [[-a, 0.0, a]], rtol=1e-6)
  dx, dscale, dbias = vjp(dy)
  np.testing.assert_allclose(dx, [[a / 6, -a / 3, a / 6]], rtol=1e-6)
  np.testing.assert_allclose(dscale, [-a, 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(dbias, [1.0, 0.0, 0.0])


def test_layer_norm_is_flax_layer_norm_with_its_gradient():
  """The same parameters and bit for bit the same values as `nn.LayerNorm` (so earlier checkpoints
  sample as before), in float32 and from bfloat16 inputs; gradients equal float32 autodiff's up to
  float rounding (the means over features are computed as products, in another order; from bfloat16
  inputs, against float32 autodiff on the same rounded inputs: the gradient is computed in float32 and
  rounded once, where flax's adds two bfloat16-rounded parts)."""
  x = 3.0 + 2.0 * jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5, 16))
  dy = jax.random.normal(jax.random.PRNGKey(1), x.shape)
  params = nn.LayerNorm().init(jax.random.PRNGKey(2), x)
  params = jax.tree.map(lambda p: p + jax.random.uniform(jax.random.PRNGKey(3), p.shape), params)
  assert jax.tree.structure(model_lib.LayerNorm().init(jax.random.PRNGKey(2), x)) == jax.tree.structure(params)
  for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)):
    inputs, cotangent = x.astype(dtype), dy.astype(dtype)
    as_f32 = lambda v: v.astype(jnp.float32)
    flax_grads = jax.vjp(jax.jit(nn.LayerNorm().apply), params, as_f32(inputs))[1](as_f32(cotangent))
    ours_y, ours_vjp = jax.vjp(jax.jit(model_lib.LayerNorm(dtype=dtype).apply), params, inputs)
    flax_y = jax.jit(nn.LayerNorm(dtype=dtype).apply)(params, inputs)
    assert ours_y.dtype == dtype
    np.testing.assert_array_equal(np.asarray(ours_y, np.float32), np.asarray(flax_y, np.float32))
    ours_grads = jax.tree.map(as_f32, ours_vjp(cotangent))
    chex.assert_trees_all_close(ours_grads, flax_grads, rtol=tol, atol=tol)
