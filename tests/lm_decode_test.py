"""The decode path of `sampling.generate` and `lm.model`'s KV cache: greedy decoding on every fixture
(with LoRA, and a mixed team) picks the tokens a whole-canvas forward pass without a cache picks, with
log-probs within 1e-5; the cache after a message equals a fresh prefill of its tokens; a decode loop's
temporary memory does not grow with the cache; and a message loop stops once every row has ended,
vmapped over seeds too."""
import dataclasses
import functools
import pathlib

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from marl_jax import model as model_lib
from marl_jax import mixed_teams, protocols, sampling, text
from marl_jax.lm import agent as lm_agent
from marl_jax.lm import hf_checkpoint
from marl_jax.lm import model as lm_model
from marl_jax.protocols import engine
from marl_jax.tasks.arithmetic import Arithmetic

from sampling_test import whole_canvas_policy

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "lm"
TASK = Arithmetic(num_ops=1)
LAYOUT = protocols.make("solver_verifier", TASK, rounds=2).layout(TASK, (0, 1))
B = 4
TEMP = 1.3


@pytest.fixture(autouse=True)
def _cache_blocks_of_five(monkeypatch):
  """Rollout caches in blocks of 5 positions, so that these canvases of 20-odd hold several (the
  decode reads only the blocks written so far, `lm.model.attend`)."""
  monkeypatch.setattr(lm_agent, "CPU_CACHE_BLOCK", 5)


def _agent(family, lora=None):
  lora = dict(enabled=lora is not None, **(lora or {}))
  return lm_agent.from_config(ml_collections.ConfigDict(dict(
      max_len=24, dtype="float32", checkpoint=str(FIXTURES / family), random_weights=False, remat=False,
      lora=lora)))


def _canvas(layout, seed=0):
  prompts = TASK.sample_batch(jax.random.split(jax.random.PRNGKey(seed), B))["prompt"]
  return engine.assemble(layout, prompts, [None] * len(layout.turn_slices))


def _assert_greedy_is_the_whole_canvas_mode(model, params_R, layout=LAYOUT):
  canvas_BxT = _canvas(layout)
  generate = jax.jit(lambda p: sampling.generate(model, layout, p, canvas_BxT, jnp.zeros(canvas_BxT.shape, bool),
                                                 jax.random.split(jax.random.PRNGKey(0), B), TEMP, True))
  tokens_BxT, logp_BxT, sampled_BxT = map(np.asarray, generate(params_R))
  logp_BxTxV = whole_canvas_policy(model, layout, params_R, jnp.asarray(tokens_BxT), TEMP)
  rows, positions = np.nonzero(sampled_BxT)
  assert len(set(positions)) >= 4, tokens_BxT  # several positions of several messages decoded
  np.testing.assert_array_equal(tokens_BxT[rows, positions], logp_BxTxV[rows, positions].argmax(-1))
  np.testing.assert_allclose(logp_BxT[rows, positions], logp_BxTxV[rows, positions].max(-1), atol=1e-5)
  assert np.all(logp_BxT[~sampled_BxT] == 0.0)


@pytest.mark.slow  # 9 s a family; the fast tier decodes in blocks below
@pytest.mark.parametrize("family", ["qwen3", "llama", "llama_chatml"])
def test_greedy_decoding_is_the_whole_canvas_forward_pass(family):
  agent = _agent(family)
  _assert_greedy_is_the_whole_canvas_mode(agent, jax.tree.map(jnp.asarray, agent.pretrained_stack(2)))


def test_greedy_decoding_where_views_hold_only_the_blocks_they_see():
  # Three voters who do not read each other's ballots: each voter's cache leaves out the blocks that
  # hold only another voter's message.
  layout = protocols.make("vote", TASK).layout(TASK, (0, 1, 1))
  agent = _agent("qwen3")
  blocks_V = [len(agent.empty_cache(1, layout.length, visible_T)[0]) for visible_T in layout.visible_VxT]
  assert min(blocks_V) < -(-layout.length // 5), blocks_V
  _assert_greedy_is_the_whole_canvas_mode(agent, jax.tree.map(jnp.asarray, agent.pretrained_stack(2)), layout)


def test_a_views_cache_holds_the_blocks_of_the_positions_it_sees():
  cfg = lm_model.LMConfig.from_hf_config(hf_checkpoint.read_hf_config(str(FIXTURES / "llama")))
  visible_T = np.zeros(12, bool)
  visible_T[[0, 1, 2, 11]] = True  # blocks of 5: [0, 5) and [10, 12) hold one; [5, 10) none
  cache = lm_model.empty_cache(cfg, 2, 12, 5, visible_T)
  assert [{o: b["v"].shape[2] for o, b in layer.items()} for layer in cache] == [{0: 5, 10: 2}] * cfg.num_hidden_layers
  assert [list(layer) for layer in lm_model.empty_cache(cfg, 2, 12, 5)] == [[0, 5, 10]] * cfg.num_hidden_layers
  assert [list(layer) for layer in lm_model.empty_cache(cfg, 2, 12, None, visible_T)] == [[0]] * cfg.num_hidden_layers


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_greedy_decoding_with_lora():
  # Adapters moved off their fresh b = 0, so each set is a different adapted model.
  agent = _agent("llama", lora=dict(rank=2, alpha=4.0, targets="q_proj,v_proj,down_proj"))
  params_R = jax.tree.map(jnp.asarray, agent.pretrained_stack(2))
  leaves, treedef = jax.tree.flatten(params_R["adapter"])
  adapter_R = treedef.unflatten([p + 0.3 * jax.random.normal(jax.random.key(i), p.shape)
                                 for i, p in enumerate(leaves)])
  _assert_greedy_is_the_whole_canvas_mode(agent, {**params_R, "adapter": adapter_R})


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_greedy_decoding_in_a_mixed_team():
  # Qwen3 solves, Llama verifies: each view's cache and calls are its own model's.
  qwen, llama = _agent("qwen3"), _agent("llama")
  team = mixed_teams.Team(("qwen", "llama"), (qwen, llama), (0, 1))
  _assert_greedy_is_the_whole_canvas_mode(team, jax.tree.map(jnp.asarray, team.pretrained_stack(2)))


@pytest.mark.parametrize("family,block", [("qwen3", None), ("llama", None), ("qwen3", 5)])
def test_cache_after_a_message_equals_a_fresh_prefill(family, block):
  cfg, params = hf_checkpoint.load(str(FIXTURES / family), max_len=16)
  T, P = 12, 7  # with blocks of 5: the prompt ends inside the second block, the message fills the third
  tokens_BxT = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, cfg.vocab_size)
  key_ok_BxT = jnp.ones((B, T), bool).at[0, :2].set(False)  # a left-padded row
  apply = jax.jit(lm_model.apply, static_argnums=0)
  prefill = jax.jit(lm_model.apply, static_argnums=(0, 3))  # the prompt at a known position, as the sampler's
  _, cache = prefill(cfg, params, tokens_BxT[:, :P], 0, key_ok_BxT, lm_model.empty_cache(cfg, B, T, block))
  for t in range(P, T):  # a message read one token at a time, as the sampler does
    _, cache = apply(cfg, params, tokens_BxT[:, t:t + 1], t, key_ok_BxT, cache)
  _, fresh = prefill(cfg, params, tokens_BxT, 0, key_ok_BxT, lm_model.empty_cache(cfg, B, T))
  assert len(cache[0]) == (1 if block is None else 3)
  # Where a key may be read: a padding position's own query sees no key, so its later layers' keys
  # and values come from a softmax over nothing, and no query reads them.
  ok_BxT = np.asarray(key_ok_BxT)
  joined = lambda blocks, n: np.concatenate([blocks[o][n] for o in sorted(blocks)], lm_model.POSITION_AXIS[n])
  readable = lambda blocks: {"k": np.where(ok_BxT[:, None, None], joined(blocks, "k"), 0),
                             "v": np.where(ok_BxT[:, None, :, None], joined(blocks, "v"), 0)}
  cache, fresh = [readable(layer) for layer in jax.device_get(cache)], [readable(layer) for layer in jax.device_get(fresh)]
  chex.assert_trees_all_close(cache, fresh, atol=1e-5, rtol=1e-5)
  assert all(np.abs(layer["k"][1:]).min(-2).all() for layer in cache)  # every readable position written


def test_a_decode_step_reads_only_the_blocks_written_so_far():
  # Blocks past the step's position hold NaN: weighed at all, even with weight 0, they would make the
  # logits NaN.  The step at the same position reads the same with a whole-canvas cache of one block.
  cfg, params = hf_checkpoint.load(str(FIXTURES / "qwen3"), max_len=16)
  T, P = 15, 7
  tokens_BxT = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, cfg.vocab_size)
  key_ok_BxT = jnp.ones((B, T), bool)
  prefill = jax.jit(lm_model.apply, static_argnums=(0, 3))
  step = jax.jit(lambda params, cache, t: lm_model.apply(cfg, params, tokens_BxT[:, P:P + 1], t, key_ok_BxT, cache)[0])
  logits = {}
  for block in (None, 5):
    _, cache = prefill(cfg, params, tokens_BxT[:, :P], 0, key_ok_BxT, lm_model.empty_cache(cfg, B, T, block))
    poisoned = [{offset: b if offset < P else jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), b)
                 for offset, b in layer.items()} for layer in cache]
    logits[block] = step(params, cache if block is None else poisoned, P)
  assert np.isfinite(logits[5]).all()
  np.testing.assert_allclose(logits[5], logits[None], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", [None, 64])
def test_decode_loop_memory_does_not_grow_with_the_cache(block):
  """A loop of decode steps over a donated cache (the message loop's carry) writes it in place: its
  temporary memory at an 8x longer canvas grows by a small fraction of the cache's growth (the
  layer scan handing out a new stacked cache copied all of it every token: at least 1x)."""
  cfg = lm_model.LMConfig.from_hf_config(hf_checkpoint.read_hf_config(str(FIXTURES / "qwen3")))
  params = jax.eval_shape(lambda: lm_model.init_stack(cfg, jax.random.key(0), 1))
  params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape[1:], p.dtype), params)

  def decode(params, cache, tokens_BxT, key_ok_BxT):
    step = lambda t, cache: lm_model.apply(cfg, params, jax.lax.dynamic_slice_in_dim(tokens_BxT, t, 1, 1), t,
                                           key_ok_BxT, cache)[1]
    return jax.lax.fori_loop(1, tokens_BxT.shape[1], step, cache)

  def memory(T):
    cache = jax.eval_shape(lambda: lm_model.empty_cache(cfg, 8, T, block))
    compiled = jax.jit(decode, donate_argnums=1).lower(
        params, cache, jax.ShapeDtypeStruct((8, T), jnp.int32), jax.ShapeDtypeStruct((8, T), bool)).compile()
    stats = compiled.memory_analysis()
    cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    assert stats.alias_size_in_bytes >= cache_bytes  # the cache is updated where it lies
    return stats.temp_size_in_bytes, cache_bytes

  (temp_short, cache_short), (temp_long, cache_long) = memory(64), memory(512)
  assert temp_long - temp_short < 0.25 * (cache_long - cache_short), (temp_short, temp_long, cache_long)


def _while_body_operands(jaxpr):
  """The avals every `while` loop in `jaxpr` (and in the jaxprs inside it) closes over in its body:
  what the loop reads on every iteration without carrying it."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "while":
      first = eqn.params["cond_nconsts"]
      yield from (v.aval for v in eqn.invars[first:first + eqn.params["body_nconsts"]])
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          yield from _while_body_operands(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          yield from _while_body_operands(sub)


@pytest.mark.slow  # 10 s of compiling two bfloat16 rollouts
def test_the_message_loop_reads_bfloat16_weights_cast_before_it(monkeypatch):
  # bfloat16 compute over float32 parameters (the trainer's): the message loop reads each weight as
  # bfloat16, cast once before the loop, never a float32 weight per token, and each layer's kernels as
  # their own buffers (`rollout_params`), never the stacked kernels, which it would slice per token.
  agent = lm_agent.from_config(ml_collections.ConfigDict(dict(
      max_len=24, dtype="bfloat16", checkpoint=str(FIXTURES / "qwen3"), random_weights=False,
      lora=dict(enabled=False))))
  # Values bfloat16 holds exactly, so that casting before the loop or inside it computes the same.
  params_R = jax.tree.map(lambda p: jnp.asarray(p).astype(jnp.bfloat16).astype(jnp.float32), agent.pretrained_stack(2))
  weight_shapes = {p.shape for p in jax.tree.leaves(
      model_lib.rollout_params(agent, model_lib.take_sets(agent, params_R, 0)))}
  canvas_BxT = _canvas(LAYOUT)
  generate = lambda p: sampling.generate(agent, LAYOUT, p, canvas_BxT, jnp.zeros(canvas_BxT.shape, bool),
                                         jax.random.split(jax.random.PRNGKey(0), B), TEMP, True)
  read = [(a.dtype, a.shape) for a in _while_body_operands(jax.make_jaxpr(generate)(params_R).jaxpr)]
  assert {shape for dtype, shape in read if dtype == jnp.bfloat16} == weight_shapes
  assert not {shape for dtype, shape in read if dtype == jnp.float32} & weight_shapes
  # The same tokens and log-probs as casting inside every layer call (the layers' own cast), reading the
  # stacked kernels.
  cast_before = jax.jit(generate)(params_R)
  monkeypatch.setattr(model_lib, "rollout_params", lambda model, params: params)
  cast_inside = jax.jit(lambda p: generate(p))(params_R)  # a new function: traced again, not the cached one
  chex.assert_trees_all_equal(cast_before, cast_inside)


def test_any_row_counts_every_vmapped_instance():
  flags_SxB = jnp.array([[False, False], [False, True]])
  np.testing.assert_array_equal(jax.vmap(lambda f: sampling.any_row(f).astype(int))(flags_SxB), [1, 1])
  np.testing.assert_array_equal(jax.vmap(lambda f: sampling.any_row(f).astype(int))(flags_SxB[:1]), [0])
  assert not sampling.any_row(flags_SxB[0]) and sampling.any_row(flags_SxB[1])


_READ_AT: list = []  # the positions the decode reads of `_Recording` were called at


@dataclasses.dataclass(frozen=True)
class _Recording(model_lib.ModelConfig):
  """The built-in model, recording where its one-token reads (the message loop's) happen."""

  def apply(self, params, tokens_BxL, start, key_ok_BxT, cache=None, readout_M=None, positions_L=None):
    if tokens_BxL.shape[1] == 1:
      jax.debug.callback(lambda t: _READ_AT.append(int(t)), start)
    return super().apply(params, tokens_BxL, start, key_ok_BxT, cache, readout_M, positions_L)


def test_message_loop_stops_once_every_row_has_ended():
  """With the first token of every message EOS, each message loop reads that token and stops; vmapped
  over seeds, a seed whose rows end at once runs on with the other seed's, and each seed's transcript
  is the one it gets alone."""
  cfg = _Recording(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=24)
  layout = protocols.make("solver_verifier", TASK).layout(TASK, (0, 0))  # two messages of one set
  params_R = jax.jit(model_lib.init_stack, static_argnums=(0, 2))(cfg, jax.random.key(0, impl="unsafe_rbg"), 1)
  eos_R = {**params_R, "unembed": {**params_R["unembed"], "bias": params_R["unembed"]["bias"].at[:, text.EOS].add(100.0)}}
  canvas_BxT, force_BxT = _canvas(layout), jnp.zeros((B, layout.length), bool)
  generate = functools.partial(sampling.generate, cfg, layout, canvas_BxT=canvas_BxT, force_BxT=force_BxT,
                               key_B=jax.random.split(jax.random.PRNGKey(0), B), temperature=TEMP)
  run = jax.jit(generate)
  _READ_AT.clear()
  tokens_BxT, logp_BxT, sampled_BxT = jax.device_get(run(eos_R))
  starts = [start for start, _ in layout.turn_slices]
  assert sorted(set(_READ_AT)) == starts, (_READ_AT, layout.turn_slices)
  for start, stop in layout.turn_slices:
    assert np.all(tokens_BxT[:, start] == text.EOS) and np.all(tokens_BxT[:, start + 1:stop] == text.PAD)
    assert np.all(sampled_BxT[:, start]) and not sampled_BxT[:, start + 1:stop].any()
    assert np.all(logp_BxT[:, start + 1:stop] == 0.0)
  alone = [run(p) for p in (eos_R, params_R)]
  both = jax.jit(jax.vmap(generate))(jax.tree.map(lambda a, b: jnp.stack([a, b]), eos_R, params_R))
  chex.assert_trees_all_equal(both, jax.tree.map(lambda a, b: jnp.stack([a, b]), *alone))
  assert not np.array_equal(alone[0][0], alone[1][0])
