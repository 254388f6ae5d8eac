"""Contribution games: game values, exact Shapley and expected difference credit on hand-worked masks,
the matrix games' exact difference credit, the parallel `contribution` protocol, and bad knobs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import protocols, tasks, text
from marl_jax.credit import exact
from marl_jax.protocols import engine
from marl_jax.tasks.contribution import Contribution
from marl_jax.tasks.hidden_sum import HiddenSum
from marl_jax.tasks.matrix_game import MatrixGame
from workflows_test import compiled_rewards


# Jitted once per game (a task is hashable): much faster than op-by-op on a CPU.
shapley = jax.jit(exact.exact_shapley, static_argnums=0)
difference = jax.jit(exact.exact_difference, static_argnums=0)


def game(name, num_roles=3, **kwargs):
  return Contribution(num_roles=num_roles, game=name, **kwargs).game_value


@pytest.mark.parametrize("name, kwargs, mask, value", [
    ("additive", {}, [1, 1, 0], 2 / 3),
    ("synergy", {}, [1, 1, 0], 0.0),
    ("synergy", {}, [1, 1, 1], 1.0),
    ("redundancy", {}, [0, 0, 1], 1.0),
    ("redundancy", {}, [0, 0, 0], 0.0),
    ("free_rider", {}, [1, 1, 0], 1 / 2),  # role 0 is ignored: one of the two others
    ("free_rider", {}, [0, 1, 1], 1.0),
    ("saboteur", {}, [0, 1, 1], 1.0),  # mean of the others x (1 - the saboteur's success)
    ("saboteur", {}, [1, 1, 1], 0.0),
    ("saboteur", {"saboteur_index": 2}, [1, 0, 0], 1 / 2),
    ("weighted", {}, [1, 0, 1], 4 / 6),  # weights 1/6, 2/6, 3/6
])
def test_game_values_by_hand(name, kwargs, mask, value):
  assert float(jax.jit(game(name, **kwargs))(jnp.array(mask, bool))) == pytest.approx(value)


def test_a_game_given_as_data_scores_like_the_task_game():
  # The credit benchmark plays every game on the same episodes: the problems carry the game's value
  # table (`game_M`), and the protocol scores them under it instead of the task's own game.
  task = Contribution(num_roles=3, game="additive")
  protocol = protocols.make("contribution", task)
  layout = protocol.layout(task, (0, 0, 0))
  problems = task.sample_batch(jax.random.split(jax.random.PRNGKey(0), 8))
  wrong = jnp.arange(8)[:, None] % 2 == jnp.arange(3)[None]  # a different success mask per row
  answers = jnp.where(wrong, problems["mistake"][:, :3], problems["answer"][:, :3])
  tokens = engine.assemble(layout, problems["prompt"], [
      jnp.stack([answers[:, r], jnp.full(8, text.EOS)], 1) for r in range(3)])
  for name in ("synergy", "saboteur", "weighted"):
    own = Contribution(num_roles=3, game=name)
    expected_B = compiled_rewards(protocol, own, layout, problems, tokens).team_B
    as_data = {**problems, "game_M": jnp.broadcast_to(own.game_values(), (8, 8))}
    np.testing.assert_allclose(compiled_rewards(protocol, task, layout, as_data, tokens).team_B, expected_B)
    np.testing.assert_allclose(own.game_values(), [own.game_value(np.array(m) == 1) for m in
                                                   [[b >> r & 1 for r in range(3)] for b in range(8)]])
  assert float(Contribution(num_roles=3, game="synergy").game_values()[7]) == 1.0  # mask 0b111


@pytest.mark.parametrize("name, kwargs, mask, phi", [
    ("additive", {}, [1, 1, 0], [1 / 3, 1 / 3, 0]),
    ("synergy", {}, [1, 1, 0], [0, 0, 0]),  # role 2 failed: no coalition is worth anything
    ("synergy", {}, [1, 1, 1], [1 / 3, 1 / 3, 1 / 3]),
    ("redundancy", {}, [1, 1, 0], [1 / 2, 1 / 2, 0]),  # two who could each do it split; a dummy gets 0
    ("free_rider", {"free_rider_index": 1}, [1, 1, 1], [1 / 2, 0, 1 / 2]),
    ("weighted", {}, [1, 0, 1], [1 / 6, 0, 1 / 2]),
    # v(S) = mean(m_1, m_2) (1 - m_0) with all three succeeding: v(1) = v(2) = 1/2, v(12) = 1, else 0;
    # the saboteur's marginals are 0, -1/2, -1/2, -1 (weights 1/3, 1/6, 1/6, 1/3): phi_0 = -1/2.
    ("saboteur", {}, [1, 1, 1], [-1 / 2, 1 / 4, 1 / 4]),
])
def test_exact_shapley_by_hand(name, kwargs, mask, phi):
  phi_BxR = shapley(game(name, **kwargs), jnp.array([mask], bool))
  np.testing.assert_allclose(phi_BxR, [phi], atol=1e-6)


def test_exact_shapley_two_roles_saboteur():
  # v({0}) = 1, v({1}) = 0, v({0, 1}) = 0: phi_0 = (1 + 0) / 2, phi_1 = (0 - 1) / 2.
  phi_BxR = shapley(game("saboteur", 2, saboteur_index=1), jnp.array([[True, True]]))
  np.testing.assert_allclose(phi_BxR, [[1 / 2, -1 / 2]], atol=1e-6)


@pytest.mark.parametrize("name", ["additive", "synergy", "redundancy", "free_rider", "saboteur", "weighted"])
def test_exact_shapley_efficiency_and_free_rider_on_random_masks(name):
  value_fn = game(name, 5, free_rider_index=3, saboteur_index=1)
  success_BxR = jax.random.bernoulli(jax.random.PRNGKey(0), 0.6, (32, 5))
  phi_BxR = shapley(value_fn, success_BxR)
  # Efficiency: the values sum to v(m) - v(nobody), and v(nobody) = 0 in every game.
  np.testing.assert_allclose(phi_BxR.sum(1), jax.jit(jax.vmap(value_fn))(success_BxR), atol=1e-5)
  np.testing.assert_allclose(phi_BxR[~success_BxR], 0.0, atol=1e-6)  # a role that failed adds nothing
  if name == "free_rider":
    np.testing.assert_allclose(phi_BxR[:, 3], 0.0, atol=1e-6)


@pytest.mark.parametrize("name, mask, p, d_R", [
    # D_r = (m_r - p_r) (v(m, m_r = 1) - v(m, m_r = 0)).
    ("additive", [1, 1, 0], 0.5, [1 / 6, 1 / 6, -1 / 6]),
    ("synergy", [1, 1, 0], 0.5, [0, 0, -1 / 2]),
    ("synergy", [1, 1, 1], [0.9, 0.5, 0.2], [0.1, 0.5, 0.8]),  # the less likely success earns more
    ("redundancy", [1, 0, 0], 0.5, [1 / 2, 0, 0]),
    ("free_rider", [1, 1, 1], 0.5, [0, 1 / 4, 1 / 4]),
    ("saboteur", [0, 1, 1], 0.5, [1 / 2, 1 / 4, 1 / 4]),  # the saboteur's failure helps
])
def test_exact_difference_by_hand(name, mask, p, d_R):
  d_BxR = difference(game(name), jnp.array([mask], bool), jnp.asarray(p))
  np.testing.assert_allclose(d_BxR, [d_R], atol=1e-6)


def test_exact_difference_per_episode_probabilities_and_its_limits():
  value_fn = game("saboteur", 2, saboteur_index=1)
  # Both succeed; the saboteur succeeds half the time: v(1,1) - (v(1,1) + v(1,0)) / 2 = -1/2.
  d_BxR = difference(value_fn, jnp.array([[1, 1], [1, 1]], bool), jnp.array([[0.5, 0.5], [0.5, 1.0]]))
  np.testing.assert_allclose(d_BxR, [[0, -1 / 2], [0, 0]], atol=1e-6)
  # A deterministic policy (p = m) has nothing to credit; p = 0 is the absent difference v(m) - v(m_-r).
  value_fn = game("weighted", 4)
  success_BxR = jax.random.bernoulli(jax.random.PRNGKey(1), 0.5, (16, 4))
  np.testing.assert_allclose(difference(value_fn, success_BxR, success_BxR.astype(float)), 0.0, atol=1e-6)
  np.testing.assert_allclose(difference(value_fn, success_BxR, jnp.zeros((16, 4))),
                             success_BxR * np.arange(1, 5) / 10, atol=1e-6)


def test_matrix_game_difference_by_hand():
  climbing = MatrixGame(game="climbing").payoffs()  # [[11, -30, 0], [-30, 7, 6], [0, 0, 5]]
  uniform = jnp.full(3, 1 / 3)
  # (0, 0) against uniform alternatives: 11 - (11 - 30 + 0) / 3 = 52/3 for either player.
  matrix_game_difference = jax.jit(exact.matrix_game_difference)
  d_2 = matrix_game_difference(climbing, 0, 0, uniform, uniform)
  np.testing.assert_allclose(d_2, [52 / 3, 52 / 3], rtol=1e-6)
  # (2, 2): the row player always plays 0 (Q(0, 2) = 0): 5; the column player 1 or 2: 5 - (0 + 5) / 2.
  d_2 = matrix_game_difference(climbing, 2, 2, jnp.array([1.0, 0, 0]), jnp.array([0, 0.5, 0.5]))
  np.testing.assert_allclose(d_2, [5, 2.5], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# The task and the protocol.


def test_sample_score_and_demonstrations():
  task = Contribution(num_roles=4, game="synergy", demo_error_rate=0.5)
  batch = tasks.eval_problems(task, 0, 2048)
  for i in range(5):
    digits = text.decode(batch["prompt"][i]).removeprefix("<bos>")
    assert text.decode(batch["answer"][i]) == f"{digits}<eos>"
    assert text.decode(batch["mistake"][i]) == "".join(str((int(d) + 1) % 10) for d in digits) + "<eos>"
  assert [name for name, _ in task.prompt_segments] == ["header", "digit0", "digit1", "digit2", "digit3"]

  @jax.jit
  def scores_and_demonstrations(batch, key_B):
    demos_BxA = jax.vmap(task.demonstrate)(batch, key_B)
    return (jax.vmap(task.score)(batch, batch["answer"]), jax.vmap(task.score)(batch, batch["mistake"]),
            demos_BxA, jax.vmap(task.success)(batch, demos_BxA))

  right_B, wrong_B, demos_BxA, success_BxR = scores_and_demonstrations(
      batch, jax.random.split(jax.random.PRNGKey(0), 2048))
  np.testing.assert_array_equal(right_B, 1.0)
  np.testing.assert_array_equal(wrong_B, 0.0)
  # Demonstrations err per role, independently: each digit right half the time, all four 1/16.
  assert np.all(np.abs(success_BxR.mean(0) - 0.5) < 0.05)
  assert abs(float(success_BxR.all(1).mean()) - 1 / 16) < 0.02
  np.testing.assert_array_equal(demos_BxA[:, -1], text.EOS)


def test_bad_knobs_name_the_key():
  with pytest.raises(ValueError, match=r"config.task.num_roles=9; allowed: an integer in 2..8"):
    tasks.make("contribution", num_roles=9)
  with pytest.raises(ValueError, match=r"config.task.game='chicken' is unknown; allowed: \['additive'"):
    tasks.make("contribution", game="chicken")
  with pytest.raises(ValueError, match=r"config.task.free_rider_index=3; allowed: an integer in 0..2"):
    tasks.make("contribution", free_rider_index=3)
  with pytest.raises(ValueError, match=r"config.task.saboteur_index=-1; allowed: an integer in 0..1"):
    tasks.make("contribution", num_roles=2, saboteur_index=-1)


def setup(**task_kwargs):
  task = tasks.make("contribution", **task_kwargs)
  protocol = protocols.make("contribution", task)
  return task, protocol, protocol.layout(task, tuple(range(len(protocol.roles))))


def test_protocol_is_parallel_and_hides_the_other_digits():
  task, protocol, layout = setup(num_roles=3)
  assert protocol.roles == ("player0", "player1", "player2")
  assert layout.turn_slices == ((5, 7), (8, 10), (11, 13)) and layout.length == 13
  visible = dict(zip(layout.segment_names, layout.visible_SxR.tolist()))
  assert visible["header"] == [True, True, True]
  assert visible["digit1"] == [False, True, False] and visible["player10"] == [False, True, False]
  # A counterfactual of one role (or a coalition) re-draws only its own messages.
  assert [layout.resampled_turns({r}) for r in range(3)] == [[0], [1], [2]]
  assert layout.resampled_turns({0, 2}) == [0, 2]
  with pytest.raises(ValueError, match="one prompt segment per role .*'part_a'"):
    protocols.make("contribution", HiddenSum())


def test_protocol_rewards_by_hand():
  task, protocol, layout = setup(num_roles=3, game="additive")
  prompt_BxP = jnp.stack([jnp.asarray(text.encode("<bos>372"))] * 3)
  batch = {"prompt": prompt_BxP, "answer": jnp.stack([jnp.asarray(text.encode("372<eos>"))] * 3)}
  messages = [("3<eos>", "7<eos>", "2<eos>"),  # all three
              ("3<eos>", "<absent><eos>", "5<eos>"),  # an absent role did nothing
              ("3<pad>", "8<eos>", "27")]  # only the first token counts
  canvas_BxT = jnp.stack([
      engine.assemble(layout, prompt_BxP[:1], [jnp.asarray(text.encode(m))[None] for m in ms])[0]
      for ms in messages])
  rewards = jax.jit(lambda task, canvas_BxT: protocol.rewards(task, layout, batch, canvas_BxT),
                    static_argnums=0)
  scored = rewards(task, canvas_BxT)
  np.testing.assert_allclose(scored.team_B, [1, 1 / 3, 2 / 3], rtol=1e-6)
  np.testing.assert_array_equal(scored.role_RxB, [[1, 1, 1], [1, 0, 0], [1, 0, 1]])
  assert float(scored.metrics["accuracy"]) == pytest.approx(2 / 3)
  assert float(scored.metrics["success_rate"]) == pytest.approx(6 / 9)
  # The same transcripts in a synergy game: only the first is worth anything.
  synergy = Contribution(num_roles=3, game="synergy")
  np.testing.assert_array_equal(rewards(synergy, canvas_BxT).team_B, [1, 0, 0])
