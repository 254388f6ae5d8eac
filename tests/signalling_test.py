"""The signalling game and the measures of its code (`marl_jax.codes`) on hand-worked cases: a
compositional code has topographic similarity 1 and all the information, a constant one none, a
random one about 0; the task's scoring and the exchange workflow's view of it."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from marl_jax import codes, protocols, sampling, tasks, text
from marl_jax import model as model_lib
from marl_jax.protocols import engine


def messages(*words: str):
  """Messages of equal length from strings of letters, one token each."""
  return jnp.array([text.encode(w) for w in words], jnp.int32)


def all_objects(num_attributes: int, num_values: int):
  return jnp.array(list(itertools.product(range(num_values), repeat=num_attributes)), jnp.int32)


def test_a_compositional_code_has_topsim_1_and_every_bit():
  # One letter per attribute, the letter naming the value: a message's Hamming distance is its
  # object's, so the rank correlation is 1, and every object has its own message: I = H(object).
  object_BxK = all_objects(3, 3)
  message_BxL = text.TOKEN_ID["a"] + object_BxK
  assert float(codes.topographic_similarity(object_BxK, message_BxL)) == pytest.approx(1.0)
  assert float(codes.mutual_information(object_BxK, message_BxL)) == pytest.approx(np.log2(27), rel=1e-6)
  # A code that tells every object apart but ignores their structure (each object a random word of
  # its own) keeps every bit and loses the topography.
  holistic_BxL = jax.random.permutation(jax.random.key(0), message_BxL)
  assert float(codes.mutual_information(object_BxK, holistic_BxL)) == pytest.approx(np.log2(27), rel=1e-6)
  assert abs(float(codes.topographic_similarity(object_BxK, holistic_BxL))) < 0.3


def test_a_constant_code_carries_nothing_and_a_random_one_about_nothing():
  object_BxK = all_objects(2, 4)
  constant_BxL = messages(*["ab"] * 16)
  assert float(codes.mutual_information(object_BxK, constant_BxL)) == 0.0
  assert float(codes.topographic_similarity(object_BxK, constant_BxL)) == 0.0  # no structure: 0, not NaN
  # Many random objects with messages drawn independently of them: topsim near 0.
  k_object, k_message = jax.random.split(jax.random.key(1))
  object_BxK = jax.random.randint(k_object, (400, 3), 0, 4)
  random_BxL = jax.random.randint(k_message, (400, 4), text.TOKEN_ID["a"], text.TOKEN_ID["a"] + 8)
  assert abs(float(codes.topographic_similarity(object_BxK, random_BxL))) < 0.03


def test_topsim_ranks_ties_by_their_average_as_spearman_does():
  # Objects 00, 01, 11 are 1, 2, 1 apart (pairs 01, 02, 12); messages aa, bb, ab are 2, 1, 1 apart.
  # Average ranks: objects (1.5, 3, 1.5), messages (3, 1.5, 1.5); centred (-.5, 1, -.5) and
  # (1, -.5, -.5): correlation -0.75 / 1.5 = -0.5.
  object_BxK = jnp.array([[0, 0], [0, 1], [1, 1]])
  assert float(codes.topographic_similarity(object_BxK, messages("aa", "bb", "ab"))) == pytest.approx(-0.5)
  assert float(codes.topographic_similarity(object_BxK, messages("aa", "ab", "bb"))) == pytest.approx(1.0)
  # And on many tied pairs, scipy's Spearman correlation.
  x_P, y_P = jax.random.randint(jax.random.key(2), (2, 300), 0, 5)
  assert float(codes.spearman(x_P, y_P)) == pytest.approx(stats.spearmanr(x_P, y_P).statistic, abs=1e-5)


def test_mutual_information_counts_the_attributes_a_code_tells_apart():
  # Four balanced objects; a message naming attribute 0 only: H(object) = 2, H(message) = 1,
  # H(object, message) = 2, so I = 1 bit.
  object_BxK = all_objects(2, 2)
  assert float(codes.mutual_information(object_BxK, messages("a", "a", "b", "b"))) == pytest.approx(1.0)
  assert float(codes.agreement(messages("a", "a", "b", "b"), messages("a", "b", "b", "b"))) == 0.75


def test_signalling_scores_attributes_or_the_exact_object():
  task = tasks.make("signalling", num_attributes=3, num_values=5)
  problem = {"prompt": jnp.array(text.encode("<bos>304")), "answer": jnp.array(text.encode("304<eos>")),
             "object": jnp.array([3, 0, 4])}
  score = lambda task, answer: float(task.score(problem, jnp.array(text.encode(answer))))
  assert score(task, "304<eos>") == 1.0 and score(task, "314<eos>") == pytest.approx(2 / 3)
  assert score(task, "a0b<eos>") == pytest.approx(1 / 3)
  exact = tasks.make("signalling", num_attributes=3, num_values=5, reward="exact")
  assert score(exact, "304<eos>") == 1.0 and score(exact, "314<eos>") == 0.0
  batch = task.sample_batch(jax.random.split(jax.random.key(0), 256))
  np.testing.assert_array_equal(batch["prompt"][:, 1:], text.DIGIT0 + batch["object"])
  assert set(np.unique(batch["object"]).tolist()) == set(range(5))
  with pytest.raises(ValueError, match=r"config.task.reward='partial' is unknown; allowed: \['attributes', 'exact'\]"):
    tasks.make("signalling", reward="partial")
  with pytest.raises(ValueError, match="config.task.num_values=11; allowed: an integer in 2..10"):
    tasks.make("signalling", num_values=11)
  assert not task.demonstrated and tasks.make("hidden_sum").demonstrated


def test_on_exchange_the_receiver_reads_only_the_message_and_the_code_is_logged():
  task = tasks.make("signalling", num_attributes=2, num_values=4)
  protocol = protocols.make("exchange", task)
  layout = protocol.layout(task, (0, 1))
  visible = dict(zip(layout.segment_names, layout.visible_SxR.tolist()))
  assert visible["part_a"] == [True, False] and visible["header"] == visible["sender0"] == [True, True]
  assert protocol.message_len == 3  # two symbols, then EOS
  # Every object, a compositional code, each receiver right on attribute 0 only.
  object_BxK = all_objects(2, 4)
  problems = {"prompt": jnp.concatenate([jnp.full((16, 1), text.BOS), text.DIGIT0 + object_BxK], 1),
              "answer": jnp.concatenate([text.DIGIT0 + object_BxK, jnp.full((16, 1), text.EOS)], 1),
              "object": object_BxK}
  sender_BxM = jnp.concatenate([text.TOKEN_ID["a"] + object_BxK, jnp.full((16, 1), text.EOS)], 1)
  receiver_BxA = problems["answer"].at[:, 1].set(text.TOKEN_ID["x"])
  tokens_BxT = engine.assemble(layout, problems["prompt"], [sender_BxM, receiver_BxA])
  scored = protocol.rewards(task, layout, problems, tokens_BxT)
  np.testing.assert_allclose(scored.team_B, 0.5)
  assert float(scored.metrics["topsim"]) == pytest.approx(1.0)
  assert float(scored.metrics["mutual_information"]) == pytest.approx(4.0)


def test_the_senders_alphabet_is_the_only_thing_it_can_write():
  # vocab=2: the sender's slot allows 'a' and 'b' only (fixed length: no EOS); the receiver's any
  # writable token.  Logits that favour '1' by far still sample only 'a' or 'b' for the sender, with
  # probability 1/2 each when their logits are equal, and teacher-forced scoring gives the same log-probs.
  task = tasks.make("signalling", num_attributes=2, num_values=4, vocab=2)
  layout = protocols.make("exchange", task).layout(task, (0, 1))
  alphabet = [text.TOKEN_ID["a"], text.TOKEN_ID["b"]]
  (s0, s1), (r0, r1) = layout.turn_slices
  assert all(np.flatnonzero(layout.allowed_TxV[t]).tolist() == alphabet for t in range(s0, s1))
  assert layout.allowed_TxV[r0:r1].all() and layout.allowed_TxV[:s0].all()
  full = tasks.make("signalling", vocab=0)
  assert protocols.make("exchange", full).layout(full, (0, 1)).allowed_TxV is None
  logp_V = sampling.policy_log_probs(jnp.zeros(text.VOCAB_SIZE).at[text.DIGIT0 + 1].set(50.0), 1.0,
                                     jnp.asarray(layout.allowed_TxV[s0]))
  np.testing.assert_allclose(np.exp(logp_V[jnp.array(alphabet)]), [0.5, 0.5], rtol=1e-6)
  assert float(jnp.exp(logp_V).sum()) == pytest.approx(1.0)

  cfg = model_lib.ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=layout.length)
  params_R = jax.jit(model_lib.init_stack, static_argnums=(0, 2))(cfg, jax.random.key(0, impl="unsafe_rbg"), 2)
  params_R["unembed"]["bias"] = params_R["unembed"]["bias"].at[:, text.DIGIT0 + 1].add(50.0)
  problems = task.sample_batch(jax.random.split(jax.random.key(1), 16))
  canvas_BxT = engine.assemble(layout, problems["prompt"], [None, None])
  tokens_BxT, logp_BxT, sampled_BxT = jax.jit(lambda p, c, k: sampling.generate(
      cfg, layout, p, c, jnp.zeros(c.shape, bool), k, 1.0))(params_R, canvas_BxT, jax.random.split(jax.random.key(2), 16))
  assert set(np.unique(tokens_BxT[:, s0:s1]).tolist()) <= set(alphabet)
  assert (tokens_BxT[:, r0] == text.DIGIT0 + 1).all()  # the receiver is not narrowed
  scored_BxT, _ = jax.jit(lambda p, t: sampling.token_log_probs(cfg, layout, p, t, 1.0))(params_R, tokens_BxT)
  np.testing.assert_allclose(np.where(sampled_BxT, scored_BxT, 0), logp_BxT, atol=1e-4)
