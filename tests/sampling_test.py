"""Sampling a transcript: log-probs, forced tokens, EOS and episode ends, forbidden tokens, visibility."""
import functools
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import model as model_lib
from marl_jax import evaluate, protocols, sampling, text
from marl_jax.protocols import engine
from marl_jax.tasks.arithmetic import Arithmetic

TASK = Arithmetic(num_ops=1)  # prompt '<bos>a+b=' (5 tokens), answer 'd<eos>' (2 tokens)
CFG = model_lib.ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=24)
B = 8
SOLVER, VERIFIER = 0, 1
TEMP = 1.3  # not 1, so that generate and token_log_probs must agree on the temperature too
# Never written by a policy: the environment's tokens, the counterfactual <absent>, the reserved tail.
ENV_ONLY = ([text.PAD, text.BOS, text.ABSENT] + [text.role_marker(i) for i in range(8)]
            + [i for i, t in enumerate(text.TOKENS) if t.startswith("<unused")])


@functools.cache
def _params(n_sets):
  """`n_sets` stacked parameter sets: the first sets of one compiled two-set initialisation."""
  # unsafe_rbg: the same initialisers with a generator that compiles in a fraction of threefry's time.
  key = jax.random.key(0, impl="unsafe_rbg")
  params_2 = jax.jit(model_lib.init_stack, static_argnums=(0, 2))(CFG, key, 2)
  return jax.tree.map(lambda p: p[:n_sets], params_2)


def _biased(params_R, tokens, bias=100.0):
  """Parameters whose unembedding strongly prefers `tokens`."""
  b = params_R["unembed"]["bias"].at[:, jnp.asarray(tokens)].add(bias)
  return {**params_R, "unembed": {**params_R["unembed"], "bias": b}}


def _layout(name, role_set_R, **kwargs):
  return protocols.make(name, TASK, **kwargs).layout(TASK, role_set_R)


def _prompts(seed=0):
  return TASK.sample_batch(jax.random.split(jax.random.PRNGKey(seed), B))["prompt"]


def _generate(layout, params_R, canvas_BxT=None, force_BxT=None, seed=0, temperature=TEMP,
              greedy=False):
  if canvas_BxT is None:
    canvas_BxT = engine.assemble(layout, _prompts(), [None] * len(layout.turn_slices))
  if force_BxT is None:
    force_BxT = jnp.zeros(canvas_BxT.shape, bool)
  keys_B = jax.random.split(jax.random.PRNGKey(seed), B)
  return _compiled("generate", layout, temperature, greedy)(params_R, canvas_BxT, force_BxT, keys_B)


def _token_log_probs(layout, params_R, tokens_BxT, temperature=TEMP):
  return _compiled("token_log_probs", layout, temperature)(params_R, tokens_BxT)


_JITTED = {}


def _compiled(name, layout, temperature, greedy=False):
  """One jitted function per layout (layouts are cached by the engine, so `id` identifies them)."""
  key = (name, id(layout), temperature, greedy)
  if key not in _JITTED:
    if name == "generate":
      fn = lambda p, c, f, k: sampling.generate(CFG, layout, p, c, f, k, temperature, greedy)
    else:
      fn = lambda p, t: sampling.token_log_probs(CFG, layout, p, t, temperature)
    _JITTED[key] = (layout, jax.jit(fn))  # holding the layout keeps its id unique
  return _JITTED[key][1]


def test_scoring_passes_merge_the_views_that_read_alike():
  passes = lambda layout: sampling.scoring_passes(layout, layout.view_set_V)[0].tolist()
  # Parallel voters of one set read the prompt and their own answer: one pass; isolated, one each.
  assert passes(_layout("vote", (0, 0, 0))) == [0, 0, 0]
  assert passes(_layout("vote", (0, 1, 2))) == [0, 1, 2]
  # Debate (views: agent0 round 0, agent0 round 1, agent1 round 0, ...): the round-0 answers read
  # alike, and so do the revisions, which read every round-0 answer; agent0's revision joins the
  # round-0 pass too (the first answer has nothing before it but the prompt in either view).
  debate = _layout("debate", (0, 0), agents=2, rounds=1)
  assert len(debate.view_set_V) == 4 and passes(debate) == [0, 0, 1, 0]
  # Agent1's round-0 answer follows agent0's: read by the revisions, its tokens attend to agent0's
  # answer; in its own round-0 view they do not, so the two cannot share a pass.
  visible_PxTxT = sampling.scoring_passes(debate, debate.view_set_V)[1]
  a1r0, agent0_answer = debate.turn_slices[1][0], slice(*debate.turn_slices[0])
  assert visible_PxTxT[0, a1r0, agent0_answer].all() and not visible_PxTxT[1, a1r0, agent0_answer].any()
  # A judge reads the candidates its solvers wrote: a pass of its own.
  assert passes(_layout("best_of_n", (0, 0, 0, 1), candidates=3)) == [0, 0, 0, 1]
  assert passes(_layout("solver_verifier", (0, 0), hidden=(("problem", "verifier"),))) == [0, 1]


def test_author_readouts_by_hand():
  readouts = lambda layout: [x.tolist() for x in sampling.author_readouts(
      layout, sampling.scoring_passes(layout, layout.view_set_V)[0])]
  # One agent: the prompt at 0-4, its marker at 5, its answer at 6-7, predicted at 5 and 6.
  assert readouts(_layout("single", (0,))) == [[6, 7], [[5, 6]], [0, 0], [0, 1]]
  # Isolated solver and verifier (marker at 8, verdict at 9-11): a pass each, the solver's padded with
  # its first position to the verifier's three.
  assert readouts(_layout("solver_verifier", (0, 1))) == [
      [6, 7, 9, 10, 11], [[5, 6, 6], [8, 9, 10]], [0, 0, 1, 1, 1], [0, 1, 0, 1, 2]]
  # Voters of one set read alike: one pass reads out all three answers.
  assert readouts(_layout("vote", (0, 0, 0))) == [[6, 7, 9, 10, 12, 13], [[5, 6, 8, 9, 11, 12]],
                                                   [0] * 6, list(range(6))]


def whole_canvas_policy(model, layout, params_R, tokens_BxT, temperature):
  """logp_BxTxV: at t >= 1 the policy position t is written from (its author's view reading the tokens
  before t), from every scoring pass's logits at every position: what `token_log_probs` computes at the
  positions a role wrote, without its read-out."""
  pass_V, visible_PxTxT, first_view_P = sampling.scoring_passes(layout, layout.view_set_V)
  key_ok_PxBxTxT = (tokens_BxT != text.PAD)[None, :, None, :] & jnp.asarray(visible_PxTxT)[:, None]
  apply = lambda params_R, tokens_BxT, key_ok_PxBxTxT: model_lib.apply_sets(
      model, params_R, [layout.view_set_V[v] for v in first_view_P], tokens_BxT, 0, key_ok_PxBxTxT)
  logits_PxBxTxV = jax.jit(apply)(params_R, tokens_BxT, key_ok_PxBxTxT)  # one program, not an op at a time
  T = tokens_BxT.shape[1]
  logits_TxBxV = logits_PxBxTxV[pass_V[layout.author_view_T[1:]], :, np.arange(T - 1)]
  logp_TxBxV = sampling.policy_log_probs(logits_TxBxV, temperature,
                                         sampling._allowed_at(layout, np.arange(1, T)[:, None]))
  return np.asarray(jnp.concatenate([jnp.zeros_like(logp_TxBxV[:1]), logp_TxBxV]).transpose(1, 0, 2))


def test_token_log_probs_read_out_the_whole_canvas_policy_where_roles_wrote():
  for name, role_set, kwargs in (("solver_verifier", (0, 1), {}), ("vote", (0, 1, 1), {}),
                                 ("best_of_n", (0, 0, 0, 1), {"candidates": 3})):
    layout = _layout(name, role_set, **kwargs)
    params_R = _params(2)
    canvas_BxT = engine.assemble(layout, _prompts(), [None] * len(layout.turn_slices))
    written_T = layout.author_T >= 0
    random_BxT = jax.random.randint(jax.random.PRNGKey(1), canvas_BxT.shape, 0, text.VOCAB_SIZE)
    tokens_BxT = jnp.where(written_T, random_BxT, canvas_BxT)
    logp_BxT, entropy_BxT = map(np.asarray, _token_log_probs(layout, params_R, tokens_BxT))
    policy_BxTxV = whole_canvas_policy(CFG, layout, params_R, tokens_BxT, TEMP)
    expected_BxT = np.take_along_axis(policy_BxTxV, np.asarray(tokens_BxT)[..., None], -1)[..., 0]
    np.testing.assert_allclose(logp_BxT[:, written_T], expected_BxT[:, written_T], rtol=1e-6, atol=1e-5)
    p_BxTxV = np.exp(policy_BxTxV)
    np.testing.assert_allclose(entropy_BxT[:, written_T], -np.sum(p_BxTxV * policy_BxTxV, -1)[:, written_T],
                               rtol=1e-5, atol=1e-5)
    assert np.all(logp_BxT[:, ~written_T] == 0.0) and np.all(entropy_BxT[:, ~written_T] == 0.0)


def test_policy_log_probs_excludes_env_tokens_and_scales_by_temperature():
  logits_2xV = jax.random.normal(jax.random.PRNGKey(0), (2, text.VOCAB_SIZE))
  logp_2xV = sampling.policy_log_probs(logits_2xV, 2.0)
  allowed = np.ones(text.VOCAB_SIZE, bool)
  allowed[ENV_ONLY] = False
  assert np.all(np.asarray(logp_2xV)[:, ~allowed] < -1e8)
  # On the allowed tokens it is log_softmax(logits / T) renormalised over them.
  expected = jax.nn.log_softmax(logits_2xV[:, allowed] / 2.0, axis=-1)
  chex.assert_trees_all_close(logp_2xV[:, allowed], expected, atol=1e-5)


@pytest.mark.slow
def test_generate_log_probs_equal_teacher_forced():
  # The sampler computes each view on its own; teacher forcing scores compatible views in one pass
  # (`scoring_passes`: the voters, each debate round, the solvers), which must not change a log-prob.
  for name, role_set, kwargs in (("single", (0,), {}), ("solver_verifier", (0, 1), {"rounds": 2}),
                                 ("vote", (0, 0, 0), {}), ("debate", (0, 0), {"agents": 2, "rounds": 2}),
                                 ("best_of_n", (0, 0, 0, 1), {"candidates": 3})):
    layout = _layout(name, role_set, **kwargs)
    params_R = _params(len(role_set))
    tokens_BxT, logp_BxT, sampled_BxT = _generate(layout, params_R)
    chex.assert_shape([tokens_BxT, logp_BxT, sampled_BxT], (B, layout.length))
    forced_logp_BxT, entropy_BxT = _token_log_probs(layout, params_R, tokens_BxT)
    sampled = np.asarray(sampled_BxT)
    assert np.all(sampled.sum(1) >= 2)  # each row sampled at least its first two messages' tokens
    assert not sampled[:, :layout.prompt_len].any() and not sampled[:, layout.env_T].any()
    np.testing.assert_allclose(np.asarray(forced_logp_BxT)[sampled], np.asarray(logp_BxT)[sampled],
                               atol=1e-4)
    assert np.all(np.asarray(logp_BxT)[~sampled] == 0.0)
    assert np.all(np.asarray(entropy_BxT)[sampled] > 0.0)


def test_prompt_and_role_markers_are_written_by_the_environment():
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  tokens_BxT, _, _ = _generate(layout, _params(2))
  np.testing.assert_array_equal(tokens_BxT[:, :layout.prompt_len], _prompts())
  for (start, _), role in zip(layout.turn_slices[:2], layout.turn_roles):  # round 1 always plays
    assert np.all(tokens_BxT[:, start - 1] == text.role_marker(role))


def test_forced_tokens_are_kept_and_not_sampled():
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  start, _ = layout.turn_slices[0]
  canvas_BxT = engine.assemble(layout, _prompts(), [None] * 4)
  canvas_BxT = canvas_BxT.at[:, start].set(text.DIGIT0 + 7)
  force_BxT = jnp.zeros(canvas_BxT.shape, bool).at[:, start].set(True)
  # Biased towards PAD-free digit '3' so the free position is sampled, and differs from the forced one.
  params_R = _biased(_params(2), [text.DIGIT0 + 3])
  tokens_BxT, logp_BxT, sampled_BxT = _generate(layout, params_R, canvas_BxT, force_BxT)
  assert np.all(tokens_BxT[:, start] == text.DIGIT0 + 7)
  assert not np.any(sampled_BxT[:, start]) and np.all(logp_BxT[:, start] == 0.0)
  assert np.all(tokens_BxT[:, start + 1] == text.DIGIT0 + 3) and np.all(sampled_BxT[:, start + 1])


def test_eos_closes_a_message():
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  solver, verifier = layout.turn_slices[:2]
  # A forced EOS as the solver's first token: the rest of the solver slot is PAD, not sampled.
  canvas_BxT = engine.assemble(layout, _prompts(), [None] * 4).at[:, solver[0]].set(text.EOS)
  force_BxT = jnp.zeros(canvas_BxT.shape, bool).at[:, solver[0]].set(True)
  tokens_BxT, _, sampled_BxT = _generate(layout, _params(2), canvas_BxT, force_BxT)
  assert np.all(tokens_BxT[:, solver[0] + 1:solver[1]] == text.PAD)
  assert not np.any(sampled_BxT[:, solver[0]:solver[1]])
  # ...and the verifier still plays its turn.
  assert np.all(tokens_BxT[:, verifier[0] - 1] == text.role_marker(VERIFIER))
  assert np.all(sampled_BxT[:, verifier[0]])
  # A sampled EOS does the same: with EOS preferred every message is 'EOS PAD...'.
  tokens_BxT, logp_BxT, sampled_BxT = _generate(layout, _biased(_params(2), [text.EOS]))
  for start, stop in layout.turn_slices:
    assert np.all(tokens_BxT[:, start] == text.EOS) and np.all(sampled_BxT[:, start])
    assert np.all(tokens_BxT[:, start + 1:stop] == text.PAD) and not np.any(sampled_BxT[:, start + 1:stop])
  assert np.all(np.asarray(logp_BxT)[np.asarray(sampled_BxT)] > -1e-3)


def test_roles_cannot_emit_environment_or_reserved_tokens():
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  params_R = _biased(_params(2), ENV_ONLY)  # the raw logits prefer exactly the forbidden tokens
  params_R = _biased(params_R, [text.EOS, text.ACCEPT], -100.0)  # and nothing ends a message early
  for greedy in (False, True):
    tokens_BxT, logp_BxT, sampled_BxT = _generate(layout, params_R, greedy=greedy)
    sampled = np.asarray(sampled_BxT)
    # Nothing is blanked, so every message token is sampled.
    assert np.all(sampled[:, ~layout.env_T])
    assert not np.isin(np.asarray(tokens_BxT)[sampled], ENV_ONLY).any()
    assert np.all(np.asarray(logp_BxT)[sampled] > -100.0)


def test_greedy_is_deterministic():
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  a = _generate(layout, _params(2), seed=1, greedy=True)
  b = _generate(layout, _params(2), seed=2, greedy=True)
  chex.assert_trees_all_equal(a, b)
  # Control: sampling with those two keys gives different transcripts.
  assert not np.array_equal(_generate(layout, _params(2), seed=1)[0],
                            _generate(layout, _params(2), seed=2)[0])


def test_each_position_is_drawn_with_its_own_key():
  # Under a uniform policy (a zero unembedding) the tokens of a message are independent draws, so few
  # repeat the token before them (1 in 50, the tokens a policy may write).  One key for every position
  # would draw the same token again and again: the same Gumbel noise on the same logits.
  params_R = _params(1)
  uniform_R = {**params_R, "unembed": jax.tree.map(jnp.zeros_like, params_R["unembed"])}
  tokens_BxT, _, sampled_BxT = map(np.asarray, _generate(_layout("solver_verifier", (0, 0)), uniform_R))
  pairs_BxT = sampled_BxT[:, 1:] & sampled_BxT[:, :-1]  # a sampled token after a sampled one
  assert pairs_BxT.sum() >= B
  assert (tokens_BxT[:, 1:] == tokens_BxT[:, :-1])[pairs_BxT].mean() < 0.25


def _policy_at(layout, params_R, tokens_BxT, t):
  """logp_BxV: the whole distribution position t is sampled from, each token's log-prob read by
  teacher forcing with that token written at t (the prediction of t reads only the tokens before it)."""
  V = CFG.vocab_size
  variants_VxBxT = jnp.broadcast_to(tokens_BxT, (V, *tokens_BxT.shape)).at[:, :, t].set(jnp.arange(V)[:, None])
  logp_VBxT, _ = _token_log_probs(layout, params_R, variants_VxBxT.reshape(V * B, -1))
  return np.asarray(logp_VBxT).reshape(V, B, -1)[:, :, t].T


def test_greedy_tokens_are_the_mode_and_entropy_is_the_policys():
  # Against each position's whole distribution: a greedy token is its most likely one, with that
  # log-prob, and the entropy token_log_probs gives is -sum p log p of that distribution.
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  tokens_BxT, logp_BxT, sampled_BxT = map(np.asarray, _generate(layout, _params(2), seed=1, greedy=True))
  _, entropy_BxT = _token_log_probs(layout, _params(2), tokens_BxT)
  positions = np.flatnonzero(sampled_BxT.any(0))
  assert len(positions) >= 4
  for t in positions:
    logp_BxV, rows = _policy_at(layout, _params(2), tokens_BxT, t), sampled_BxT[:, t]
    np.testing.assert_array_equal(tokens_BxT[rows, t], logp_BxV[rows].argmax(-1))
    np.testing.assert_allclose(logp_BxT[rows, t], logp_BxV[rows].max(-1), atol=1e-4)
    np.testing.assert_allclose(np.asarray(entropy_BxT)[rows, t], -(np.exp(logp_BxV) * logp_BxV).sum(-1)[rows],
                               rtol=1e-4, atol=1e-5)


def test_traced_greedy_flag_decodes_as_the_constant_one_in_one_program():
  """Evaluation passes `greedy` as an argument, so greedy and sampled decoding share one program."""
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  canvas_BxT = engine.assemble(layout, _prompts(), [None] * len(layout.turn_slices))
  force_BxT, keys_B = jnp.zeros(canvas_BxT.shape, bool), jax.random.split(jax.random.PRNGKey(1), B)
  traced = jax.jit(lambda p, g: sampling.generate(CFG, layout, p, canvas_BxT, force_BxT, keys_B, TEMP, g))
  for greedy in (True, False):
    chex.assert_trees_all_equal(traced(_params(2), jnp.asarray(greedy)),
                                _generate(layout, _params(2), seed=1, greedy=greedy))
  assert traced._cache_size() == 1


class _CountingModel(model_lib.SetStack):
  """A model whose token costs 1000 FLOPs plus one per key attended to."""

  def flops_per_token(self, context_len):
    return 1000 + context_len


def test_episode_flops_against_the_minimum_by_hand():
  # single: T = 8 (prompt 5, marker, answer 2); the one view needs positions 0..6, with 1..7 keys,
  # and reads exactly those.
  flops = sampling.episode_flops(_CountingModel(), _layout("single", (0,)))
  assert flops == {"lockstep": 8 * 1008, "computed": 7 * 1008, "minimum": 7000 + sum(range(1, 8))}
  # solver-verifier: T = 12; the solver's view needs 0..6 (its last logits predict its EOS at 7), the
  # verifier's 0..10; the sampler reads 0..6 with the solver's view and 0..10 with the verifier's: 18
  # reads of a 12-key canvas.
  flops = sampling.episode_flops(_CountingModel(), _layout("solver_verifier", (0, 1)))
  assert flops == {"lockstep": 24 * 1012, "computed": 18 * 1012,
                   "minimum": 7000 + sum(range(1, 8)) + 11000 + sum(range(1, 12))}


def test_accept_ends_the_episode():
  layout = _layout("solver_verifier", (0, 1), rounds=2)
  s0, v0, s1, v1 = layout.turn_slices
  prompts = _prompts()
  canvas_BxT = engine.assemble(layout, prompts, [None] * 4)
  # Rows 0..3: the verifier's first token is ACCEPT; rows 4..7: REJECT.
  verdict_B = jnp.where(jnp.arange(B) < 4, text.ACCEPT, text.REJECT)
  canvas_BxT = canvas_BxT.at[:, v0[0]].set(verdict_B)
  force_BxT = jnp.zeros(canvas_BxT.shape, bool).at[:, v0[0]].set(True)
  tokens_BxT, logp_BxT, sampled_BxT = _generate(layout, _params(2), canvas_BxT, force_BxT)
  accepted, rejected = slice(0, 4), slice(4, 8)
  assert np.all(tokens_BxT[accepted, v0[0] + 1:] == text.PAD)  # markers of round 2 too
  assert not np.any(sampled_BxT[accepted, v0[0]:]) and np.all(logp_BxT[accepted, v0[0]:] == 0.0)
  assert np.all(tokens_BxT[rejected, s1[0] - 1] == text.role_marker(SOLVER))
  assert np.all(tokens_BxT[rejected, v1[0] - 1] == text.role_marker(VERIFIER))
  assert np.all(sampled_BxT[rejected, s1[0]]) and np.all(sampled_BxT[rejected, v0[0] + 1])

  # ACCEPT ends the episode only as the verifier's first token: a solver writing it plays on.
  tokens_BxT, _, sampled_BxT = _generate(layout, _biased(_params(2), [text.ACCEPT]))
  assert np.all(tokens_BxT[:, s0[0]:s0[1]] == text.ACCEPT)
  assert np.all(tokens_BxT[:, v0[0]] == text.ACCEPT) and np.all(sampled_BxT[:, v0[0]])
  assert np.all(tokens_BxT[:, v0[0] + 1:] == text.PAD) and not np.any(sampled_BxT[:, v0[0] + 1:])


def test_hidden_segment_does_not_affect_a_role():
  """With the problem hidden from the verifier, changing the problem changes nothing it computes."""
  prompts_a = _prompts(seed=0)
  # Same layout of tokens, different operands: '<bos>a op b=' with every digit replaced.
  digit = (prompts_a >= text.DIGIT0) & (prompts_a < text.DIGIT0 + 10)
  prompts_b = jnp.where(digit, text.DIGIT0 + (prompts_a - text.DIGIT0 + 3) % 10, prompts_a)
  assert not np.array_equal(prompts_a, prompts_b)

  def logp_verifier_and_solver(hidden):
    layout = _layout("solver_verifier", (0, 0), rounds=1, hidden=hidden)  # shared parameters
    messages = [jnp.full((B, 2), text.DIGIT0 + 4), jnp.full((B, 3), text.DIGIT0 + 5)]
    out = []
    for prompts in (prompts_a, prompts_b):
      logp_BxT, ent_BxT = _token_log_probs(layout, _params(1), engine.assemble(layout, prompts, messages))
      out.append(np.stack([logp_BxT, ent_BxT]))
    is_verifier_T = (layout.author_T == VERIFIER) & ~layout.env_T
    is_solver_T = (layout.author_T == SOLVER) & ~layout.env_T
    same = lambda mask_T: np.allclose(out[0][..., mask_T], out[1][..., mask_T], atol=1e-6)
    return layout, same(is_verifier_T), same(is_solver_T)

  layout, verifier_same, solver_same = logp_verifier_and_solver(hidden=(("problem", "verifier"),))
  assert len(layout.view_set_V) == 2  # shared parameters, two visibilities: two views
  assert verifier_same and not solver_same
  layout, verifier_same, _ = logp_verifier_and_solver(hidden=())
  assert len(layout.view_set_V) == 1 and not verifier_same  # control: a visible problem matters

  # Sampling too: with the solver's answer forced, the verifier's messages do not depend on the problem.
  layout = _layout("solver_verifier", (0, 0), rounds=1, hidden=(("problem", "verifier"),))
  solver, verifier = layout.turn_slices
  force_BxT = jnp.zeros((B, layout.length), bool).at[:, solver[0]:solver[1]].set(True)
  answer = [jnp.full((B, 2), text.DIGIT0 + 4), None]
  runs = [_generate(layout, _params(1), engine.assemble(layout, p, answer), force_BxT)
          for p in (prompts_a, prompts_b)]
  chex.assert_trees_all_close(*[jax.tree.map(lambda x: x[:, verifier[0]:], r) for r in runs], atol=1e-6)


def test_js_divergence_by_hand():
  # p = (1, 0), q = (1/2, 1/2): m = (3/4, 1/4), KL(p||m) = log(4/3), KL(q||m) = (log(2/3) + log 2) / 2.
  log = lambda *x: jnp.log(jnp.array(x))
  expected = 0.5 * (np.log(4 / 3) + 0.5 * (np.log(2 / 3) + np.log(2)))
  np.testing.assert_allclose(sampling.js_divergence(log(1.0, 1e-30), log(0.5, 0.5)), expected, rtol=1e-6)
  np.testing.assert_allclose(sampling.js_divergence(log(0.2, 0.8), log(0.2, 0.8)), 0.0, atol=1e-7)


def test_next_token_divergence_compares_sets_on_each_roles_own_tokens():
  layout = _layout("solver_verifier", (SOLVER, VERIFIER))
  params_2 = _params(2)
  tokens_BxT, _, _ = _generate(layout, params_2)
  divergence = jax.jit(lambda p, t: sampling.next_token_divergence(CFG, layout, (0, 1), p, t, TEMP))
  js_sum_RxS, count_R = divergence(params_2, tokens_BxT)
  # The tokens counted are each role's own written tokens (EOS included, PAD after it not).
  written_BxT = (tokens_BxT != text.PAD) & ~layout.env_T[None]
  expected = [int((written_BxT & (layout.author_T == r)[None]).sum()) for r in (SOLVER, VERIFIER)]
  np.testing.assert_array_equal(count_R, expected)
  # A set against itself: 0; two different initialisations: a positive divergence for both roles.
  np.testing.assert_allclose(np.diagonal(js_sum_RxS), 0.0, atol=1e-5)
  assert (js_sum_RxS[[0, 1], [1, 0]] > 0.01 * count_R).all()
  # Two copies of one set: nothing to tell the roles apart.
  copies = jax.tree.map(lambda p: jnp.stack([p[0], p[0]]), params_2)
  np.testing.assert_allclose(divergence(copies, tokens_BxT)[0], 0.0, atol=1e-5)


def test_role_divergence_is_the_mean_over_the_other_roles_of_their_sets_divergence():
  # Two voters sharing set 0 and an aggregator with set 1: on voter0's tokens, voter1 answers with the
  # same set (divergence 0) and the aggregator with set 1 (JS[voter0, set 1]): voter0's value is their
  # mean over the R - 1 = 2 other roles, JS[voter0, set 1] / 2.  The aggregator's two others both use
  # set 0: JS[aggregator, set 0].  Each JS is a sum over the role's tokens over their count.
  layout = _layout("vote", (0, 0, 1), voters=2, aggregator=True)
  params_2 = _params(2)
  tokens_BxT, _, _ = _generate(layout, params_2)
  exp = types.SimpleNamespace(model=CFG, layout=layout, role_set_R=(0, 0, 1),
                              config=types.SimpleNamespace(rl=types.SimpleNamespace(temperature=TEMP)))
  replicated = jax.sharding.PartitionSpec()  # role_divergence sums over the devices of a data mesh
  out = jax.jit(jax.shard_map(lambda p, t: evaluate.role_divergence(exp, evaluate.divergence_sums(exp, p, t)),
                              mesh=jax.make_mesh((1,), ("data",)), in_specs=replicated,
                              out_specs=replicated))(params_2, tokens_BxT)
  divergence = jax.jit(lambda p, t: sampling.next_token_divergence(CFG, layout, (0, 0, 1), p, t, TEMP))
  js_sum_RxS, count_R = divergence(params_2, tokens_BxT)
  js_RxS = np.asarray(js_sum_RxS) / np.asarray(count_R)[:, None]
  assert (js_RxS[[0, 1, 2], [1, 1, 0]] > 1e-3).all()  # the two sets differ on every role's tokens
  expected = {"voter0": js_RxS[0, 1] / 2, "voter1": js_RxS[1, 1] / 2, "aggregator": js_RxS[2, 0]}
  assert set(out) == {f"{role}/next_token_js" for role in expected}
  for role, value in expected.items():
    np.testing.assert_allclose(out[f"{role}/next_token_js"], value, rtol=1e-5, err_msg=role)
  # One set for every role: nothing to compare, nothing logged (not a row of zeros).
  shared = types.SimpleNamespace(**{**vars(exp), "role_set_R": (0, 0, 0)})
  assert evaluate.divergence_sums(shared, _params(1), tokens_BxT) is None
  assert evaluate.role_divergence(shared, None) == {}


def test_read_schedule_reads_each_position_once_per_view_that_acts():
  """Isolated solver-verifier (prompt 0..4, solver's marker 5 and message 6..7, verifier's marker 8
  and message 9..11): the solver prefills 0..5 and reads 6 as it writes it; the verifier prefills
  0..8 (the solver's turn with it) and reads 9..10.  A second round starts each view's chunk at the
  last token it wrote, which it had not read."""
  layout = _layout("solver_verifier", (0, 1))
  assert layout.turn_slices == ((6, 8), (9, 12))
  assert sampling.read_schedule(layout) == [(0, ((0, 6),), 6, 8), (1, ((0, 9),), 9, 12)]
  assert sampling.token_reads(layout) == (6 + 1) + (9 + 2)
  two_rounds = _layout("solver_verifier", (0, 1), rounds=2)
  assert two_rounds.turn_slices == ((6, 8), (9, 12), (13, 15), (16, 19))
  assert sampling.read_schedule(two_rounds) == [(0, ((0, 6),), 6, 8), (1, ((0, 9),), 9, 12),
                                                (0, ((7, 13),), 13, 15), (1, ((11, 16),), 16, 19)]
  assert sampling.token_reads(two_rounds) == 7 + 11 + (6 + 1) + (5 + 2)
  # A shared 2-agent, 1-round debate (prompt 0..6; marker + answer at 7-9, 10-12, 13-15, 16-18), each
  # turn through its own view, from position 0: agent1's round 0 skips agent0's round-0 answer (7..9),
  # and agent1's round 1 skips agent0's round-1 answer (13..15), written in the same round.
  debate = protocols.make("debate", Arithmetic(), agents=2, rounds=1).layout(Arithmetic(), (0, 0))
  assert sampling.read_schedule(debate) == [
      (0, ((0, 8),), 8, 10), (2, ((0, 7), (10, 11)), 11, 13), (1, ((0, 14),), 14, 16),
      (3, ((0, 13), (16, 17)), 17, 19)]
  assert sampling.token_reads(debate) == (8 + 1) + (8 + 1) + (14 + 1) + (14 + 1)
