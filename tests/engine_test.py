"""Protocol engine: canvas layouts of single and solver_verifier, view dedup, and config errors."""
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import protocols, tasks, text
from marl_jax.protocols import engine
from marl_jax.tasks.arithmetic import Arithmetic

TASK = Arithmetic(num_ops=2)  # prompt '<bos>a+b*c=' is 7 tokens; an answer 'd<eos>' is 2
ENV, AGENT, SOLVER, VERIFIER = engine.ENV, 0, 0, 1


def test_task_lengths():
  assert (TASK.prompt_len, TASK.answer_len) == (7, 2)


def test_single_layout():
  layout = protocols.make("single", TASK).layout(TASK, (0,))
  # prompt 0..6 | marker 7 | answer 8..9
  assert layout.length == 10 and layout.prompt_len == 7
  assert layout.roles == ("agent",) and layout.segment_names == ("problem", "agent0")
  assert layout.turn_slices == ((8, 10),) and layout.turn_roles == (AGENT,)
  np.testing.assert_array_equal(layout.author_T, [ENV] * 8 + [AGENT] * 2)
  np.testing.assert_array_equal(layout.env_T, [True] * 8 + [False] * 2)
  np.testing.assert_array_equal(layout.segment_T, [0] * 7 + [1] * 3)
  np.testing.assert_array_equal(layout.turn_T, [-1] * 7 + [0] * 3)
  np.testing.assert_array_equal(layout.marker_T, [text.PAD] * 7 + [text.role_marker(0)] + [text.PAD] * 2)
  assert layout.header_starts == (7,)
  assert not layout.ends_episode_TxV.any()  # nothing ends a single agent's episode early
  assert layout.view_set_V == (0,) and layout.role_view_R == (0,)


def test_solver_verifier_layout():
  layout = protocols.make("solver_verifier", TASK, rounds=2).layout(TASK, (0, 1))
  # prompt 0..6 | S 7, answer 8..9 | V 10, verdict 11..13 | S 14, 15..16 | V 17, 18..20
  assert layout.length == 21 and layout.prompt_len == 7
  assert layout.segment_names == ("problem", "solver0", "verifier0", "solver1", "verifier1")
  assert layout.turn_slices == ((8, 10), (11, 14), (15, 17), (18, 21))
  assert layout.turn_roles == (SOLVER, VERIFIER, SOLVER, VERIFIER)
  assert layout.role_turns(SOLVER) == [0, 2] and layout.role_turns(VERIFIER) == [1, 3]
  np.testing.assert_array_equal(
      layout.author_T, [ENV] * 8 + [SOLVER] * 2 + [ENV] + [VERIFIER] * 3 + [ENV] + [SOLVER] * 2 + [ENV]
      + [VERIFIER] * 3)
  np.testing.assert_array_equal(np.flatnonzero(layout.env_T), list(range(8)) + [10, 14, 17])
  markers = {7: text.role_marker(0), 10: text.role_marker(1), 14: text.role_marker(0),
             17: text.role_marker(1)}
  np.testing.assert_array_equal(layout.marker_T, [markers.get(t, text.PAD) for t in range(21)])
  np.testing.assert_array_equal(layout.segment_T, [0] * 7 + [1] * 3 + [2] * 4 + [3] * 3 + [4] * 4)
  # Only ACCEPT as a verifier's first token ends the episode.
  positions, tokens = np.nonzero(layout.ends_episode_TxV)
  np.testing.assert_array_equal(positions, [11, 18])
  np.testing.assert_array_equal(tokens, [text.ACCEPT] * 2)
  assert layout.visible_SxR.all()
  assert layout.view_set_V == (0, 1) and layout.role_view_R == (0, 1)
  np.testing.assert_array_equal(layout.author_view_T, [0] * 11 + [1] * 3 + [0] * 4 + [1] * 3)


@pytest.mark.parametrize("role_set, hidden, view_set, role_view", [
    ((0, 0), (), (0,), (0, 0)),  # shared parameters, same visibility: one forward pass
    ((0, 1), (), (0, 1), (0, 1)),  # isolated
    ((0, 0), (("problem", "verifier"),), (0, 0), (0, 1)),  # shared parameters, different visibility
])
def test_views_dedup(role_set, hidden, view_set, role_view):
  layout = protocols.make("solver_verifier", TASK, hidden=hidden).layout(TASK, role_set)
  assert layout.view_set_V == view_set and layout.role_view_R == role_view
  assert layout.visible_VxT.shape == (len(view_set), layout.length)


def test_hidden_segment_visibility():
  layout = protocols.make("solver_verifier", TASK, hidden=(("problem", "verifier"),)).layout(TASK, (0, 1))
  verifier_view = layout.role_view_R[VERIFIER]
  visible_T = layout.visible_VxT[verifier_view]
  np.testing.assert_array_equal(visible_T, [False] * 7 + [True] * 7)
  assert layout.visible_VxT[layout.role_view_R[SOLVER]].all()
  # A role always reads its own messages, even when told otherwise.
  layout = protocols.make("solver_verifier", TASK, hidden=(("verifier0", "verifier"),)).layout(TASK, (0, 1))
  assert layout.visible_SxR[2, VERIFIER]


@pytest.mark.parametrize("protocol_name, task, kwargs, expected", [
    ("single", TASK, {}, {0: [0]}),
    # solver: everything after it reads its answer; verifier: its ACCEPT can end the episode.
    ("solver_verifier", TASK, dict(rounds=2), {SOLVER: [0, 1, 2, 3], VERIFIER: [1, 2, 3]}),
    # The round-1 solver does not read verifier0's verdict, but an ACCEPT there ends the episode, so
    # whether round 1 is played at all follows the verifier: it is re-drawn all the same.
    ("solver_verifier", TASK, {"rounds": 2, "hidden": (("verifier0", "solver"),)},
     {SOLVER: [0, 1, 2, 3], VERIFIER: [1, 2, 3]}),
    # Simultaneous play: each player's counterfactual keeps the other's action.
    ("matrix_game", tasks.make("matrix_game"), {}, {0: [0], 1: [1]}),
    # Parallel workers (turns 0..2) do not read each other; the orchestrator (turn 3) reads them all.
    ("orchestrator", tasks.make("multi_chain", num_chains=3), {}, {0: [3], 1: [0, 3], 2: [1, 3], 3: [2, 3]}),
    # With nothing hidden, the second worker reads the first one's report.
    ("orchestrator", tasks.make("multi_chain", num_chains=2), dict(hidden=()), {1: [0, 1, 2], 2: [1, 2]}),
])
def test_resampled_turns(protocol_name, task, kwargs, expected):
  protocol = protocols.make(protocol_name, task, **kwargs)
  layout = protocol.layout(task, tuple(range(len(protocol.roles))))
  for role, turns in expected.items():
    assert layout.resampled_turns({role}) == turns, protocol.roles[role]


def test_resampled_turns_of_a_coalition():
  # Orchestrator with three workers: changing workers 0 and 2 re-draws their reports and the
  # orchestrator's answer, and keeps worker 1's report.
  task = tasks.make("multi_chain", num_chains=3)
  protocol = protocols.make("orchestrator", task)
  layout = protocol.layout(task, (0, 1, 2, 3))
  assert layout.resampled_turns({1, 3}) == [0, 2, 3]
  assert layout.resampled_turns(set()) == []
  assert layout.resampled_turns({0, 1, 2, 3}) == [0, 1, 2, 3]


def test_assemble_and_message_round_trip():
  layout = protocols.make("solver_verifier", TASK, rounds=1).layout(TASK, (0, 1))
  prompt_BxP = jnp.full((2, 7), text.DIGIT0 + 1).at[:, 0].set(text.BOS)
  answer_BxA = jnp.array([[text.DIGIT0 + 3, text.EOS]] * 2)
  canvas_BxT = engine.assemble(layout, prompt_BxP, [answer_BxA, None])
  assert canvas_BxT.shape == (2, layout.length) and canvas_BxT.dtype == jnp.int32
  np.testing.assert_array_equal(engine.message(layout, canvas_BxT, 0), answer_BxA)
  np.testing.assert_array_equal(engine.message(layout, canvas_BxT, 1), np.full((2, 3), text.PAD))
  np.testing.assert_array_equal(canvas_BxT[:, [7, 10]], [[text.role_marker(0), text.role_marker(1)]] * 2)


def test_render_writes_one_line_per_reached_segment():
  layout = protocols.make("solver_verifier", TASK, rounds=2).layout(TASK, (0, 1))
  # The verifier accepts the first answer: the episode ends, round 1's slots stay blank.
  prompt_1xP = jnp.array([text.encode("<bos>3+4*2=")])
  messages = [jnp.array([text.encode(m)]) for m in ("7<eos>", "<accept><eos><pad>")]
  canvas_T = engine.assemble(layout, prompt_1xP, [*messages, None, None])[0]
  # Names right-aligned to 12 characters; role markers and padding dropped; solver1 and verifier1
  # (padding but for their markers) left out.
  assert layout.render(canvas_T) == ("     problem: <bos>3+4*2=\n"
                                     "     solver0: 7<eos>\n"
                                     "   verifier0: <accept><eos>")


def test_error_visibility_hides_the_prompt_from_every_role():
  protocol = protocols.make("solver_verifier", TASK, hidden=(("problem", "solver"), ("problem", "verifier")))
  with pytest.raises(ValueError, match="hides prompt segment 'problem' from every role"):
    protocol.layout(TASK, (0, 1))


def test_error_hidden_names_unknown_segment_or_role():
  with pytest.raises(ValueError, match=r"segments are \['problem', 'solver0', 'verifier0'\]"):
    protocols.make("solver_verifier", TASK, hidden=(("nope", "solver"),)).layout(TASK, (0, 1))
  with pytest.raises(ValueError, match=r"roles are \['solver', 'verifier'\]"):
    protocols.make("solver_verifier", TASK, hidden=(("problem", "judge"),)).layout(TASK, (0, 1))


@pytest.mark.parametrize("role_set", [(0,), (0, 1, 2)])
def test_error_role_map_with_wrong_length(role_set):
  with pytest.raises(ValueError, match=rf"gives {len(role_set)} parameter sets for roles \('solver', 'verifier'\)"):
    protocols.make("solver_verifier", TASK).layout(TASK, role_set)


def test_error_unknown_protocol_key_and_name():
  with pytest.raises(ValueError, match=r"keys \['roundz'\] that protocol 'solver_verifier' does not take; "
                                       r"allowed: \[.*'rounds'"):
    protocols.make("solver_verifier", TASK, roundz=2)
  with pytest.raises(ValueError, match=r"keys \['rounds'\] that protocol 'single'"):
    protocols.make("single", TASK, rounds=2)
  with pytest.raises(ValueError, match=r"config.protocol.name='nope' is unknown; allowed: \[.*'single'"):
    protocols.make("nope", TASK)
  with pytest.raises(ValueError, match=r"config.protocol.rounds=0; allowed: an integer >= 1"):
    protocols.make("solver_verifier", TASK, rounds=0)
