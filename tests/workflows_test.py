"""The published workflows vote, best_of_n and debate, and peer_review: schedules, visibility, final-answer rules and
rewards on hand-built transcripts, debate's influence bonuses worked out by hand, the role-collapse
rate, bad input, and each experiment's tiny variant through the command line."""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import checkpoint, configs, experiment, judging, loop, protocols, sampling, state, tasks, text, train
from marl_jax import model as model_lib
from marl_jax.protocols import debate, engine, vote
from marl_jax.tasks.arithmetic import Arithmetic

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASK = Arithmetic(num_ops=1)  # prompt '<bos>0+d=' (5 tokens), answers 'd<eos>'
D = lambda d: [text.DIGIT0 + d, text.EOS]
ABSENT = [text.ABSENT, text.EOS]


def compiled_rewards(protocol, task, layout, problems, canvas_BxT) -> engine.Scored:
  """`protocol.rewards` as one compiled program: called as it is, each of its ops compiles on its own
  (a debate transcript's rewards: 9 s so, 2 s compiled, on the shared 2-core CPU)."""
  return jax.jit(lambda p, c: protocol.rewards(task, layout, p, c))(problems, canvas_BxT)


def compiled_demonstrate(protocol, task, layout, problems, keys):
  """`protocol.demonstrate` as one compiled program (`compiled_rewards`)."""
  return jax.jit(lambda p, k: protocol.demonstrate(task, layout, p, k))(problems, keys)


def _transcript(name, targets, messages, **knobs):
  """Problems whose answers are `targets` ('<bos>0+d=') and a canvas holding `messages[b][turn]`."""
  protocol = protocols.make(name, TASK, **knobs)
  layout = protocol.layout(TASK, tuple(range(len(protocol.roles))))
  prompt_BxP = jnp.array([text.encode(f"<bos>0+{t}=") for t in targets])
  problems = {"prompt": prompt_BxP, "answer": jnp.array([D(t) for t in targets])}
  turns = [jnp.array([row[i] for row in messages]) for i in range(len(messages[0]))]
  return protocol, layout, problems, engine.assemble(layout, prompt_BxP, turns)


def test_a_single_agent_is_its_own_only_member():
  protocol, layout, problems, canvas_BxT = _transcript("single", [3, 3, 3, 3], [[D(3)], [D(5)], [D(3)], [ABSENT]])
  m = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT).metrics
  np.testing.assert_allclose([m["accuracy"], m["agent/member_accuracy"]], [0.5, 0.5])


def test_orchestrator_workers_member_accuracy_by_hand():
  # '<bos>3+4,2*3=': parts 7 and 6, answer 3.  Each worker's report against its own part's answer:
  #          worker0  worker1  final  team
  rows = [("7", "6", "3"),  # right    right    3      1
          ("7", "5", "2"),  # right    wrong    2      0
          ("1", "5", "3")]  # wrong    wrong    3      1 (the orchestrator solved it alone)
  task = tasks.make("multi_chain", num_chains=2, num_ops=1)
  protocol = protocols.make("orchestrator", task)
  layout = protocol.layout(task, (0, 1, 2))
  prompt_BxP = jnp.array([text.encode("<bos>3+4,2*3=")] * 3)
  problems = {"prompt": prompt_BxP, "answer": jnp.array([text.encode("3<eos>")] * 3),
              "part_values": jnp.array([[7, 6]] * 3)}
  messages = [jnp.array([text.encode(row[i] + "<eos>") + [text.PAD] * (stop - start - 2) for row in rows])
              for i, (start, stop) in enumerate(layout.turn_slices)]
  m = compiled_rewards(protocol, task, layout, problems, engine.assemble(layout, prompt_BxP, messages)).metrics
  np.testing.assert_allclose(m["accuracy"], 2 / 3)
  np.testing.assert_allclose([m["worker0/member_accuracy"], m["worker1/member_accuracy"]], [2 / 3, 1 / 3])
  np.testing.assert_allclose(m["worker_accuracy"], 1 / 2)  # their mean
  assert "orchestrator/member_accuracy" not in m


def test_relay_rewards_by_hand():
  # Three agents, the last one's 4-token slot answers; only the answer's first 2 tokens ('d<eos>')
  # count, and only the last agent's message does.
  PAD2 = [text.PAD] * 2
  messages = [[D(7), D(7), D(7) + PAD2],  # right
              [D(7), D(7), D(5) + PAD2],  # the earlier agents right, the answer wrong
              [D(5), D(1), D(7) + PAD2],  # the earlier agents wrong, the answer right
              [D(7), D(7), [text.DIGIT0 + 7] * 2 + [text.EOS, text.PAD]],  # '77': wrong
              [D(7), D(7), [text.DIGIT0 + 7] + [text.PAD] * 3]]  # no EOS: wrong
  protocol, layout, problems, canvas_BxT = _transcript("relay", [7] * 5, messages, agents=3, message_len=2,
                                                       answer_len=4)
  scored = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT)
  np.testing.assert_array_equal(scored.team_B, [1, 0, 1, 0, 0])
  np.testing.assert_array_equal(scored.role_RxB, [[1, 0, 1, 0, 0]] * 3)
  assert scored.metrics["accuracy"] == 0.4


def _answers(*rows):
  """answers_KxBxA from rows of digits (None: `<absent>`)."""
  return jnp.array([[ABSENT if d is None else D(d) for d in row] for row in rows]).transpose(1, 0, 2)


def _experiment(name):
  return configs.sibling(str(ROOT / "experiments" / "tasks.py"), name)


def _visible(layout, turn):
  """The segments turn `turn` reads."""
  return [name for name, seen in zip(layout.segment_names, layout.visible_SxN[:, turn]) if seen]


# ---------------------------------------------------------------------------------------------
# Shared pieces: majority with its tie rule, the same-message rate.

@pytest.mark.parametrize("votes, winner", [
    ((5, 5, 7), 5),
    ((7, 5, 5), 5),
    ((5, 7, 9), 5),  # three-way tie: voter0's answer
    ((9, 7, 5), 9),
    ((7, 5, 5, 7), 7),  # 2-2 tie: the earliest voter among the tied answers wrote 7
    ((5, 7, 7, 5), 5),
    ((3, 7, 5, 5), 5),
    ((None, 7, 5), 7),  # absent votes do not count: 7 and 5 tie, voter1 is earlier
    ((None, 5, 7, 7), 7),
    ((None, None, None), None),  # nothing to count: voter0's (absent) message
])
def test_majority_and_its_tie_rule(votes, winner):
  final_BxA = vote.majority(_answers(votes))
  np.testing.assert_array_equal(final_BxA[0], ABSENT if winner is None else D(winner))


def test_majority_compares_answers_up_to_their_eos():
  # '5<eos>7' and '5<eos><pad>' are the same answer; '7<eos>' is outvoted.
  answers_KxBxA = jnp.array([[[text.DIGIT0 + 7, text.EOS, text.PAD]],
                             [[text.DIGIT0 + 5, text.EOS, text.DIGIT0 + 7]],
                             [[text.DIGIT0 + 5, text.EOS, text.PAD]]])
  assert vote.majority(answers_KxBxA)[0, 0] == text.DIGIT0 + 5


def test_same_message_rate_by_hand():
  # Row 0: only voters 0 and 1 agree (1 pair of 3); row 1: all agree (3 of 3); row 2: none agree.
  # (1 + 3 + 0) / 9 pairs.
  rate = engine.same_message_rate(_answers((5, 5, 7), (4, 4, 4), (1, 2, 3)))
  np.testing.assert_allclose(rate, 4 / 9, rtol=1e-6)
  np.testing.assert_allclose(engine.same_message_rate(_answers((5, 5))), 1.0)


def test_a_rate_over_an_empty_subset_is_undefined():
  hits, among = jnp.array([True, False, True]), jnp.array([True, True, False])
  np.testing.assert_allclose(judging.rate(hits, among), 1 / 2)  # the third hit is outside the subset
  assert np.isnan(judging.rate(hits, jnp.zeros(3, bool)))  # not 0: no case to count


# ---------------------------------------------------------------------------------------------
# vote

def test_vote_schedule_and_visibility():
  protocol = protocols.make("vote", TASK, voters=3, aggregator=True)
  layout = protocol.layout(TASK, (0, 0, 0, 1))
  assert protocol.roles == ("voter0", "voter1", "voter2", "aggregator")
  assert layout.segment_names == ("problem", "voter00", "voter10", "voter20", "aggregator0")
  assert layout.turn_roles == (0, 1, 2, 3)
  # Voters read the problem and their own answer, not another voter's (the aggregator writes after
  # them); the aggregator reads everything.
  for i in range(3):
    assert _visible(layout, i) == ["problem", f"voter{i}0", "aggregator0"]
  assert _visible(layout, 3) == list(layout.segment_names)
  # One parameter set for the voters, but each reads differently: one view per voter, + aggregator.
  assert layout.view_set_V == (0, 0, 0, 1) and layout.turn_view_N == (0, 1, 2, 3)
  # Parallel voters: re-drawing voter0 re-draws only itself and the aggregator that read it.
  assert layout.resampled_turns({0}) == [0, 3]


def test_vote_rewards_by_hand():
  # Every target is 3.  Voters' answers                 majority  team  voter signals
  messages = [[D(3), D(3), D(5)],  # 2 of 3 right          3        1     1 1 0
              [D(3), D(5), D(5)],  # majority wrong        5        0     1 0 0
              [D(3), D(5), D(7)],  # all differ: voter0    3        1     1 0 0
              [ABSENT, D(5), D(3)]]  # absent left out: tie 5-3, voter1   0     0 0 1
  protocol, layout, problems, canvas_BxT = _transcript("vote", [3] * 4, messages)
  out = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT)
  np.testing.assert_array_equal(out.team_B, [1, 0, 1, 0])
  np.testing.assert_array_equal(out.role_RxB, [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]])
  np.testing.assert_allclose(out.metrics["accuracy"], 0.5)
  np.testing.assert_allclose(out.metrics["majority_right"], 0.5)
  np.testing.assert_allclose(out.metrics["voter_accuracy"], 5 / 12)
  # Each voter's own answer (the absent one is not right): 3/4, 1/4, 1/4, their mean voter_accuracy.
  for role, value in (("voter0", 3 / 4), ("voter1", 1 / 4), ("voter2", 1 / 4)):
    np.testing.assert_allclose(out.metrics[f"{role}/member_accuracy"], value, err_msg=role)
  # Agreeing pairs: 1, 1, 0, 0 of 3 per row.
  np.testing.assert_allclose(out.metrics["agreement"], 2 / 12, rtol=1e-6)
  assert out.metrics["same_message_rate"] == out.metrics["agreement"]
  assert out.turn_NxB is None


def test_vote_with_an_aggregator():
  # The aggregator's answer is final, right or wrong; an absent aggregator leaves the majority.
  messages = [[D(5), D(5), D(3), D(3)],  # majority wrong, aggregator right    team 1
              [D(3), D(3), D(5), D(5)],  # majority right, aggregator wrong    team 0
              [D(3), D(3), D(5), ABSENT],  # absent aggregator: the majority   team 1
              [D(7), D(7), D(3), D(3)]]  # majority wrong, aggregator right    team 1
  protocol, layout, problems, canvas_BxT = _transcript("vote", [3] * 4, messages, aggregator=True)
  out = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT)
  np.testing.assert_array_equal(out.team_B, [1, 0, 1, 1])
  np.testing.assert_array_equal(out.role_RxB[3], out.team_B)  # the aggregator's signal: team outcome
  # The voters' majority, not the team's final answer: right in rows 1 and 2 only (accuracy is 3/4).
  np.testing.assert_allclose(out.metrics["majority_right"], 2 / 4)
  np.testing.assert_allclose(out.metrics["accuracy"], 3 / 4)


def test_vote_aggregator_demonstrations_write_the_majority():
  # Arithmetic's demonstrations are the answer or its one systematic mistake, so of three voters at
  # least two agree: the aggregator writes the answer that two or three of them wrote, whichever voter
  # wrote it (at error rate 0.5, voter0 is outvoted in about a quarter of the rows).
  task = dataclasses.replace(TASK, demo_error_rate=0.5)
  protocol = protocols.make("vote", task, voters=3, aggregator=True)
  layout = protocol.layout(task, (0, 0, 0, 1))
  keys = jax.random.split(jax.random.PRNGKey(0), 64)
  canvas_BxT = compiled_demonstrate(protocol, task, layout, task.sample_batch(keys), keys)
  answers_KxBxA = np.asarray(protocol.answers(layout, canvas_BxT))
  aggregate_BxA = np.asarray(engine.message(layout, canvas_BxT, 3))
  copies_B = (answers_KxBxA == aggregate_BxA[None]).all(-1).sum(0)
  assert (copies_B >= 2).all()
  assert (answers_KxBxA[0] != aggregate_BxA).any()  # some row where voter0 was outvoted


# ---------------------------------------------------------------------------------------------
# best_of_n

def test_peer_review_rewards_and_judgments_by_hand():
  # Two judges, 4 levels (0, 1/3, 2/3, 1); the answer is 3.  Episodes: solver, judge0, judge1.
  messages = [[D(3), D(3), D(2)],  # right: judge0 sure (accepts), judge1 2/3 (accepts)
              [D(5), D(1), D(3)],  # wrong: judge0 1/3 (rejects), judge1 sure (a false accept)
              [D(3), [text.DIGIT0 + 7, text.EOS], D(0)],  # right: judge0 unreadable (level 0), judge1 0
              [D(5), ABSENT, D(0)]]  # wrong: judge0 absent (level 0), judge1 0
  protocol, layout, problems, tokens_BxT = _transcript("peer_review", [3] * 4, messages, judges=2)
  assert protocol.roles == ("solver", "judge0", "judge1") and protocol.judge_roles == (1, 2)
  assert not layout.visible_SxR[layout.segment_names.index("judge00"), 2]  # judges do not read each other
  scored = compiled_rewards(protocol, TASK, layout, problems, tokens_BxT)
  np.testing.assert_array_equal(scored.team_B, [1, 0, 1, 0])
  np.testing.assert_array_equal(scored.judgments.level_JxKxB[:, 0], [[3, 1, 0, 0], [2, 3, 0, 0]])
  np.testing.assert_array_equal(scored.judgments.truth_KxB, [[1, 0, 1, 0]])
  assert scored.judgments.answer_roles == (0,)
  # A judge's signal: its verdict (accept: more than 1/2) agrees with the checker.
  np.testing.assert_array_equal(scored.role_RxB, [[1, 0, 1, 0], [1, 1, 0, 1], [1, 0, 0, 1]])
  np.testing.assert_allclose(scored.metrics["accept_rate"], 3 / 8)
  np.testing.assert_allclose(scored.metrics["false_accept"], 1 / 4)  # 1 of the 4 verdicts on wrong answers
  np.testing.assert_allclose(scored.metrics["false_reject"], 2 / 4)  # 2 of the 4 on right ones
  np.testing.assert_allclose(scored.metrics["verdict_accuracy"], 5 / 8)


@pytest.mark.parametrize("error_rate", [0.0, 1.0])
def test_peer_review_demonstrations_state_levels_on_the_wanted_side(error_rate):
  # Judges' demonstrated verdicts agree with the checker at error rate 0 and disagree at 1, over levels
  # of both kinds (sure and not) on that side.
  task = tasks.make("arithmetic", demo_error_rate=0.5)
  protocol = protocols.make("peer_review", task, judges=3, judge_demo_error_rate=error_rate)
  layout = protocol.layout(task, (0, 1, 1, 1))
  problems = task.sample_batch(jax.random.split(jax.random.key(0), 256))
  tokens_BxT = compiled_demonstrate(protocol, task, layout, problems, jax.random.split(jax.random.key(1), 256))
  scored = compiled_rewards(protocol, task, layout, problems, tokens_BxT)
  np.testing.assert_array_equal(scored.role_RxB[1:], 1.0 - error_rate)
  assert set(np.unique(scored.judgments.level_JxKxB)) == {0, 1, 2, 3}


def test_best_of_n_schedule_and_visibility():
  protocol = protocols.make("best_of_n", TASK, candidates=3)
  layout = protocol.layout(TASK, (0, 0, 0, 1))
  assert protocol.roles == ("solver0", "solver1", "solver2", "judge")
  assert layout.segment_names == ("problem", "solver00", "solver10", "solver20", "judge0")
  assert [t.length for t in protocol.turns] == [2, 2, 2, 2]  # the judge: one digit, then EOS
  for i in range(3):
    assert _visible(layout, i) == ["problem", f"solver{i}0", "judge0"]  # the judge writes later
  assert _visible(layout, 3) == list(layout.segment_names)


PICK = lambda i: [text.DIGIT0 + i, text.EOS]


def test_best_of_n_pick_and_rewards_by_hand():
  # Every target is 3; three candidates.  The judge's message     final   team  judge signal
  messages = [[D(5), D(3), D(7), PICK(1)],  # picks the right one       3       1     1
              [D(5), D(3), D(7), PICK(2)],  # picks a wrong one         7       0     0
              [D(3), D(5), D(7), PICK(3)],  # no candidate 3 (0..2): unreadable -> first  1  0
              [D(3), D(5), D(7), [text.DIGIT0 + 1, text.DIGIT0 + 1]],  # no EOS: first   1  0
              [D(5), D(3), D(7), ABSENT],  # absent judge: first       5       0     0
              [D(5), D(6), D(7), PICK(2)],  # none right, readable pick 7      0     1
              [D(5), D(6), D(7), PICK(7)]]  # none right, unreadable   5       0     0
  protocol, layout, problems, canvas_BxT = _transcript("best_of_n", [3] * 7, messages, candidates=3)
  pick_B, readable_B = protocol.pick(layout, canvas_BxT)
  np.testing.assert_array_equal(pick_B, [1, 2, 0, 0, 0, 2, 0])
  np.testing.assert_array_equal(readable_B, [1, 1, 0, 0, 0, 1, 0])
  np.testing.assert_array_equal(protocol.final_answer(layout, canvas_BxT)[:, 0] - text.DIGIT0,
                                [3, 7, 3, 3, 5, 7, 5])
  out = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT)
  np.testing.assert_array_equal(out.team_B, [1, 0, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(out.role_RxB[3], [1, 0, 0, 0, 0, 1, 0])
  np.testing.assert_array_equal(out.role_RxB[:3].sum(0), [1, 1, 1, 1, 1, 0, 0])
  m = out.metrics
  np.testing.assert_allclose(m["oracle"], 5 / 7)
  # Of the five episodes with a right candidate the judge picked one right: rows 2 and 3 fall back to
  # a right first candidate, but an unreadable pick is no pick.
  np.testing.assert_allclose(m["judge_precision"], 1 / 5)
  np.testing.assert_allclose(m["candidate_accuracy"], 5 / 21, rtol=1e-6)
  # Each candidate: solver0 right in rows 2 and 3, solver1 in rows 0, 1 and 4, solver2 never (the
  # judge is no member: it answers no problem).
  for role, value in (("solver0", 2 / 7), ("solver1", 3 / 7), ("solver2", 0.0)):
    np.testing.assert_allclose(m[f"{role}/member_accuracy"], value, rtol=1e-6, err_msg=role)
  assert "judge/member_accuracy" not in m
  np.testing.assert_allclose(m["readable_pick"], 3 / 7)
  np.testing.assert_allclose(m["same_message_rate"], 0.0)
  # The judge's verdicts for rewards from peers: it endorses the candidate it picked, none when its pick
  # is unreadable or it is absent; the checker's verdict on every candidate.
  assert protocol.judge_roles == (3,) and out.judgments.answer_roles == (0, 1, 2)
  np.testing.assert_array_equal(out.judgments.level_JxKxB[0], [[0, 0, 0, 0, 0, 0, 0],
                                                               [1, 0, 0, 0, 0, 0, 0],
                                                               [0, 1, 0, 0, 0, 1, 0]])
  np.testing.assert_array_equal(out.judgments.truth_KxB, out.role_RxB[:3])


def test_best_of_n_demonstrations_pick_right_candidates():
  # A judge without demo errors picks a right candidate whenever there is one.
  task = Arithmetic(num_ops=1, demo_error_rate=0.5)
  protocol = protocols.make("best_of_n", task, candidates=3, judge_demo_error_rate=0.0)
  layout = protocol.layout(task, (0, 0, 0, 1))
  keys = jax.random.split(jax.random.PRNGKey(0), 64)
  problems = task.sample_batch(keys)
  out = compiled_rewards(protocol, task, layout, problems, compiled_demonstrate(protocol, task, layout, problems, keys))
  assert 0 < out.metrics["oracle"] < 1
  np.testing.assert_allclose(out.metrics["judge_precision"], 1.0)
  # A judge that always errs picks a wrong candidate wherever there is one: the team is right only
  # where every candidate is.
  protocol = protocols.make("best_of_n", task, candidates=3, judge_demo_error_rate=1.0)
  canvas_BxT = compiled_demonstrate(protocol, task, layout, problems, keys)
  out = compiled_rewards(protocol, task, layout, problems, canvas_BxT)
  all_right_B = out.role_RxB[:3].min(0)
  assert 0 < all_right_B.mean() < out.metrics["oracle"]
  np.testing.assert_array_equal(out.team_B, all_right_B)


# ---------------------------------------------------------------------------------------------
# debate

def test_debate_schedule_and_per_turn_visibility():
  protocol = protocols.make("debate", TASK, agents=3, rounds=2)
  layout = protocol.layout(TASK, (0, 0, 0))
  assert layout.segment_names == ("problem", "agent00", "agent10", "agent20", "agent01", "agent11",
                                  "agent21", "agent02", "agent12", "agent22")
  assert layout.turn_roles == (0, 1, 2) * 3  # round-major: turn n = round * K + agent
  # Round 0: independent answers.
  assert _visible(layout, 1) == ["problem", "agent10", "agent11", "agent12"]
  # Round 1, agent 1: the round-0 answers of all and its own history; not agent0's round-1 answer
  # written just before it.
  assert _visible(layout, 4) == ["problem", "agent00", "agent10", "agent20", "agent11", "agent12"]
  # Round 2, agent 0: only the others' round-1 answers, not their round-0 ones.
  assert _visible(layout, 6) == ["problem", "agent00", "agent01", "agent11", "agent21", "agent02"]
  # The role as a whole reads everything; each turn reads through its own view.
  assert layout.visible_SxR.all() and layout.turn_view_N == (0, 3, 6, 1, 4, 7, 2, 5, 8)
  assert layout.view_set_V == (0,) * 9
  # Re-drawing agent0 re-draws its turns and every later turn that reads one of them.
  assert layout.resampled_turns({0}) == [0, 3, 4, 5, 6, 7, 8]
  assert protocols.make("debate", TASK, rounds=1).layout(TASK, (0, 1, 2)).resampled_turns({2}) == [2, 3, 4, 5]


def test_debate_turns_read_only_what_their_round_allows():
  # Teacher-forced log-probs under one shared parameter set, two agents, one revision round (turns:
  # agent0 and agent1 answer, then agent0 and agent1 revise).  Changing agent0's first answer moves
  # agent1's revision (which reads it) but not agent1's first answer (parallel); changing agent0's
  # revision does not move agent1's revision (same round).
  layout = protocols.make("debate", TASK, agents=2, rounds=1).layout(TASK, (0, 0))
  cfg = model_lib.ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=layout.length)
  params_R = model_lib.init_stack(cfg, jax.random.PRNGKey(0), 1)
  logp = jax.jit(lambda tokens_BxT: sampling.token_log_probs(cfg, layout, params_R, tokens_BxT, 1.0)[0])
  prompt_BxP = jnp.array([text.encode("<bos>0+3=")] * 3)
  answers = lambda first0, revision0: [jnp.array([D(d)] * 3) for d in (first0, 4, revision0, 6)]
  logp_CxBxT = np.stack([logp(engine.assemble(layout, prompt_BxP, answers(*a)))
                         for a in ((1, 2), (7, 2), (1, 8))])
  moved = lambda c, turn: not np.allclose(logp_CxBxT[0][:, slice(*layout.turn_slices[turn])],
                                          logp_CxBxT[c][:, slice(*layout.turn_slices[turn])], atol=1e-6)
  assert moved(1, 3) and not moved(1, 1)  # agent0's first answer: read in round 1, not round 0
  assert not moved(2, 3)  # agent0's revision: not read by agent1's revision
  assert moved(1, 2)  # control: agent0's revision reads its own first answer


def test_influence_bonus_by_hand():
  # Two agents, two revision rounds; correctness c[round, agent]:
  #   round 0: agent0 wrong, agent1 right
  #   round 1: agent0 right (a fix), agent1 right
  #   round 2: agent0 right, agent1 wrong (a break)
  c_JxK = [[0, 1], [1, 1], [1, 0]]
  alpha, beta = 0.5, 0.25
  bonus_JxK = debate.influence_bonus(jnp.array(c_JxK, jnp.float32)[..., None], alpha, beta)[..., 0]
  expected = [[0.0, beta],  # agent1's round-0 answer was read by agent0, who then went right
              [alpha - beta, 0.0],  # agent0 fixed its answer; agent1 then went right -> wrong
              [0.0, -alpha]]  # agent1 broke its answer (the last round influences nobody)
  np.testing.assert_allclose(bonus_JxK, expected)
  # No influence rewards: plain co-training.
  np.testing.assert_array_equal(debate.influence_bonus(jnp.array(c_JxK, jnp.float32)[..., None], 0, 0), 0)


def test_debate_rewards_by_hand():
  # Three agents, one revision round, every target 3.  Row 0: agent0 is right alone, then agent1
  # follows it (agent1 fixes) and agent2 stays wrong: last round 3,3,5 -> majority 3.  Row 1: all
  # right, then agent2 breaks: majority still 3.
  messages = [[D(3), D(5), D(5), D(3), D(3), D(5)],
              [D(3), D(3), D(3), D(3), D(3), D(7)]]
  protocol, layout, problems, canvas_BxT = _transcript("debate", [3, 3], messages, rounds=1, alpha=0.5,
                                                       beta=0.25)
  out = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT)
  np.testing.assert_array_equal(out.team_B, [1, 1])
  np.testing.assert_array_equal(out.role_RxB, [[1, 1], [1, 1], [0, 0]])  # last-round answers
  # Row 0: round-0 turns: agent0 +beta (agent1 went right), agent1 0, agent2 +beta; round 1: agent1
  # fixed (+alpha).  Row 1: round 0: agents 0 and 1 -beta each (agent2 went wrong); agent2 broke.
  np.testing.assert_allclose(out.turn_NxB.T, [[0.25, 0, 0.25, 0, 0.5, 0], [-0.25, -0.25, 0, 0, 0, -0.5]])
  m = out.metrics
  np.testing.assert_allclose(m["fix_rate"], 1 / 2)  # 1 fix of 2 wrong round-0 answers
  np.testing.assert_allclose(m["break_rate"], 1 / 4)  # 1 break of 4 right ones
  np.testing.assert_allclose(m["round0_accuracy"], 0.5)  # row 0's round-0 majority is 5
  np.testing.assert_allclose(m["round1_accuracy"], 1.0)
  # Each agent's last-round answer: agent0 3, 3; agent1 3, 3; agent2 5, 7.
  for role, value in (("agent0", 1.0), ("agent1", 1.0), ("agent2", 0.0)):
    np.testing.assert_allclose(m[f"{role}/member_accuracy"], value, err_msg=role)
  np.testing.assert_allclose(m["agreement"], (1 / 3 + 1 / 3) / 2, rtol=1e-6)
  np.testing.assert_allclose(m["same_message_rate"], (1 / 3 + 1) / 2, rtol=1e-6)
  # Agreement is over answers as the majority counts them (the task's vote_key: here every message is
  # one answer); same_message_rate stays over messages, token for token.
  one_answer = dataclasses.replace(protocol, vote_key=lambda message_A: jnp.zeros(1, message_A.dtype))
  m = compiled_rewards(one_answer, TASK, layout, problems, canvas_BxT).metrics
  np.testing.assert_allclose([m["agreement"], m["same_message_rate"]], [1.0, (1 / 3 + 1) / 2], rtol=1e-6)


def test_debate_final_answer_is_the_last_rounds_majority():
  # Round 0 agrees on 3; the last round says 5, 5, 3: the final answer is 5.
  messages = [[D(3), D(3), D(3), D(5), D(5), D(3)]]
  protocol, layout, _, canvas_BxT = _transcript("debate", [3], messages)
  np.testing.assert_array_equal(protocol.final_answer(layout, canvas_BxT), [D(5)])


def test_debate_with_a_verifier_by_hand():
  # Two agents, one revision round, target 3: agent0 says 3 then 3; agent1 says 5 then 3 (a fix).  The
  # verifier accepts, accepts, rejects, accepts: a false accept (agent1's 5) and a false reject
  # (agent0's second 3), so the bonuses follow its verdicts c = [[1, 1], [0, 1]], not the truth
  # [[1, 0], [1, 1]].
  verdicts = [text.ACCEPT, text.ACCEPT, text.REJECT, text.ACCEPT, text.EOS]
  messages = [[D(3), D(5), D(3), D(3), verdicts], [D(3), D(5), D(3), D(3), ABSENT + [text.PAD] * 3]]
  protocol, layout, problems, canvas_BxT = _transcript("debate", [3, 3], messages, agents=2, rounds=1,
                                                       alpha=0.5, beta=0.25, scorer="verifier")
  assert layout.roles == ("agent0", "agent1", "verifier") and layout.turn_roles == (0, 1, 0, 1, 2)
  assert _visible(layout, 4) == list(layout.segment_names)  # the verifier reads the whole debate
  assert layout.turn_slices[4][1] - layout.turn_slices[4][0] == 5  # four verdicts and EOS
  out = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT)
  # Row 0: agent0's round-0 turn: beta (c[1,1] - c[0,1]) = 0; agent1's: beta (c[1,0] - c[0,0]) = -beta;
  # agent0's revision: alpha (c[1,0] - c[0,0]) = -alpha; agent1's: 0; the verifier's turn: 0.  Row 1:
  # an absent verifier judges every answer wrong, so nothing changes and no turn earns a bonus.
  np.testing.assert_allclose(out.turn_NxB.T, [[0, -0.25, -0.5, 0, 0], [0, 0, 0, 0, 0]])
  np.testing.assert_allclose(out.metrics["turn_bonus"], -0.75 / 8)  # per debater turn, not the verifier's
  np.testing.assert_array_equal(out.team_B, [1, 1])  # the checker's score of the majority
  # The agents' last-round answers; the verifier's agreement with the checker: 2 of 4, then the
  # absent one "rejects" the one wrong answer of 4.
  np.testing.assert_allclose(out.role_RxB, [[1, 1], [1, 1], [0.5, 0.25]])
  m = out.metrics
  np.testing.assert_allclose(m["verdict_accuracy"], (0.5 + 0.25) / 2)
  np.testing.assert_allclose(m["false_accept"], 1 / 2)  # accepted among the two wrong answers
  np.testing.assert_allclose(m["false_reject"], 4 / 6)  # rejected among the six right ones
  np.testing.assert_allclose(m["fix_rate"], 1.0)  # still the checker's: agent1 fixed its answer
  # The verifier judges: its verdicts on the last-round answers (reject, accept; then the absent
  # verifier's none) are the judgments rewards from peers read, beside the checker's (both right).
  assert protocol.judge_roles == (2,) and out.judgments.answer_roles == (0, 1)
  np.testing.assert_array_equal(out.judgments.level_JxKxB, [[[0, 0], [1, 0]]])
  np.testing.assert_array_equal(out.judgments.truth_KxB, [[1, 1], [1, 1]])
  assert protocols.make("debate", TASK, agents=2, rounds=1).judge_roles == ()  # the checker scores: no judge
  # The same debate scored by the checker: agent1's round-0 turn read by agent0 (still right) earns
  # nothing, agent0's round-0 turn +beta (agent1 went right), agent1's revision +alpha.
  checker = protocols.make("debate", TASK, agents=2, rounds=1, alpha=0.5, beta=0.25)
  checker_layout = checker.layout(TASK, (0, 1))
  canvas = engine.assemble(checker_layout, problems["prompt"], [jnp.array([D(d)] * 2) for d in (3, 5, 3, 3)])
  np.testing.assert_allclose(compiled_rewards(checker, TASK, checker_layout, problems, canvas).turn_NxB.T,
                             [[0.25, 0, 0, 0.5]] * 2)


@pytest.mark.parametrize("error_rate", [0.0, 1.0])
def test_debate_verifier_demonstrations_are_the_checkers_verdicts(error_rate):
  # Without noise the verdicts are the checker's; at error rate 1 every one of them is flipped.
  protocol = protocols.make("debate", TASK, agents=3, rounds=1, scorer="verifier",
                            verifier_demo_error_rate=error_rate)
  layout = protocol.layout(TASK, (0, 0, 0, 1))
  problems = TASK.sample_batch(jax.random.split(jax.random.PRNGKey(0), 64))
  canvas_BxT = compiled_demonstrate(protocol, TASK, layout, problems, jax.random.split(jax.random.PRNGKey(1), 64))
  right_JxKxB = jax.vmap(jax.vmap(jax.vmap(TASK.score), (None, 0)), (None, 0))(
      problems, protocol.answers(layout, canvas_BxT))
  np.testing.assert_array_equal(protocol.verdicts(layout, canvas_BxT), (right_JxKxB > 0) != error_rate)
  assert 0 < float((right_JxKxB > 0).mean()) < 1  # both verdicts occur
  out = compiled_rewards(protocol, TASK, layout, problems, canvas_BxT)
  np.testing.assert_allclose(out.metrics["verdict_accuracy"], 1.0 - error_rate)


@pytest.mark.parametrize("arg, role_set, trainable", [
    ("scorer=verifier", (0, 0, 0, 1), (True, False)),
    ("scorer=verifier,sharing=isolated,agents=2", (0, 1, 2), (True, True, False)),
    ("scorer=verifier,train_verifier=true", (0, 0, 0, 1), (True, True)),
])
def test_debate_experiment_gives_the_verifier_its_own_frozen_set(arg, role_set, trainable):
  config = _experiment("debate").get_config(f"size=tiny,{arg}")
  config.num_devices = 1
  exp = experiment.build(config)
  assert exp.role_set_R == role_set and exp.trainable_R == trainable


def _debate_experiment(**knobs):
  config = _experiment("debate").get_config("size=tiny")
  config.num_devices = 1
  config.protocol.update(knobs)
  return experiment.build(config)


def test_turn_rewards_add_to_any_estimators_advantages():
  # Debate, 2 agents x 2 rounds: a per-role estimator's adv_RxB goes to each role's tokens, and the
  # protocol's turn_NxB on top of it to each turn's tokens.
  exp = _debate_experiment(agents=2, rounds=1)
  layout = exp.layout
  sampled_BxT = jnp.ones((1, layout.length), bool)
  adv_RxB = jnp.array([[1.0], [2.0]])
  turn_NxB = jnp.array([[0.1], [0.2], [0.3], [0.4]])
  adv_BxT = np.asarray(train.token_advantages(exp, adv_RxB, sampled_BxT, turn_NxB))
  for n, (start, stop) in enumerate(layout.turn_slices):
    np.testing.assert_allclose(adv_BxT[0, start:stop], adv_RxB[layout.turn_roles[n], 0] + turn_NxB[n, 0])
  np.testing.assert_array_equal(adv_BxT[:, layout.env_T], 0)
  np.testing.assert_array_equal(train.token_advantages(exp, adv_RxB, sampled_BxT),
                                train.token_advantages(exp, adv_RxB, sampled_BxT, 0 * turn_NxB))


def test_the_step_hands_the_protocols_turn_rewards_to_the_update(monkeypatch):
  # Debate's influence bonuses reach the update only if the step passes them on: traced (not compiled
  # or run), the step's update_batch gets one per turn and row, and so its advantages (above) hold them.
  config = _experiment("debate").get_config("size=tiny")
  config.num_devices, config.sft.steps = 1, 0
  exp = experiment.build(config)
  turn_rewards, update_batch = [], train.update_batch

  def spy(exp, state, episodes, adv_xB, turn_NxB=None, labels=None):
    turn_rewards.append(turn_NxB)
    return update_batch(exp, state, episodes, adv_xB, turn_NxB, labels)

  monkeypatch.setattr(train, "update_batch", spy)
  jax.eval_shape(train.make_train_call(exp), loop.initial_state(exp))
  assert len(turn_rewards) == 1 and turn_rewards[0] is not None
  assert turn_rewards[0].shape == (len(exp.layout.turn_slices), exp.config.rl.batch_size)


# ---------------------------------------------------------------------------------------------
# Engine: per-turn hidden segments; bad input.

def test_turn_hidden_keeps_the_roles_own_messages():
  protocol = engine.Protocol(roles=("a", "b"), turns=(engine.Turn("a", 2), engine.Turn("b", 2),
                                                      engine.Turn("a", 2, hidden=("a0", "b0"))))
  layout = protocol.layout(TASK, (0, 0))
  assert _visible(layout, 2) == ["problem", "a0", "a1"]  # hides b0, not its own a0
  with pytest.raises(ValueError, match=r"turn 0 \(a\) hides 'c0'; segments are \['problem', 'a0'\]"):
    engine.Protocol(roles=("a",), turns=(engine.Turn("a", 2, hidden=("c0",)),)).layout(TASK, (0,))


@pytest.mark.parametrize("name, knobs, match", [
    ("vote", dict(voters=1), r"config.protocol.voters=1; allowed: an integer in 2..8"),
    ("vote", dict(voters=8, aggregator=True), r"config.protocol.voters=8; allowed: an integer in 2..7 .*8 role markers"),
    ("vote", dict(aggregator="yes"), r"config.protocol.aggregator='yes' is unknown; allowed: \[False, True\]"),
    ("best_of_n", dict(candidates=8), r"config.protocol.candidates=8; allowed: an integer in 2..7"),
    ("best_of_n", dict(candidates=1), r"config.protocol.candidates=1; allowed: an integer in 2..7"),
    ("debate", dict(agents=9), r"config.protocol.agents=9; allowed: an integer in 2..8"),
    ("debate", dict(rounds=0), r"config.protocol.rounds=0; allowed: an integer >= 1 \(0 rounds is a vote\)"),
    ("debate", dict(beta=-1.0), r"config.protocol.beta=-1.0; allowed: a number >= 0"),
    ("debate", dict(gamma=1.0), r"keys \['gamma'\] that protocol 'debate' does not take; allowed: .*'alpha'"),
    ("debate", dict(scorer="oracle"), r"config.protocol.scorer='oracle' is unknown; allowed: \['checker', 'verifier'\]"),
    ("debate", dict(agents=8, scorer="verifier"), r"config.protocol.agents=8; allowed: an integer in 2..7"),
])
def test_bad_protocol_knobs(name, knobs, match):
  with pytest.raises(ValueError, match=match):
    protocols.make(name, TASK, **knobs)


@pytest.mark.parametrize("name, arg, match", [
    ("vote", "aggregator=maybe", r"aggregator='maybe' is unknown; allowed: \['false', 'true'\]"),
    ("vote", "voters=1", r"config.protocol.voters=1; allowed: an integer in 2..8"),
    ("vote", "voters=three", r"config argument voters='three' must be int"),
    ("best_of_n", "task=matrix_game", r"task='matrix_game' is unknown; allowed: \['arithmetic', "),
    ("best_of_n", "sharing=voters", r"sharing='voters' is unknown; allowed: \['solvers', 'shared', 'isolated'\]"),
    ("debate", "alpha=-1", r"config.protocol.alpha=-1.0; allowed: a number >= 0"),
    ("debate", "credit=nope", r"credit='nope' is unknown"),
    ("debate", "scorer=judge", r"scorer='judge' is unknown; allowed: \['checker', 'verifier'\]"),
    ("delegate", "workflow=solo", r"workflow='solo' is unknown; allowed: \['delegate', 'single'\]"),
    ("delegate", "workflow=single,aux=none", r"aux, trainable_workers and worker_sets apply to workflow=delegate only"),
    ("delegate", "task=wide,worker_sets=5", r"worker_sets='5' for 4 workers; allowed: shared, per_slot, or a "
                                            r"number of groups in 1..4"),
    ("delegate", "task=wide,workers=65", r"workers=65 for task=wide; allowed: 0 \(the default\) or 2..64"),
    ("peer_review", "source=judges", r"source='judges' is unknown; allowed: \['peer', 'checker'\]"),
    ("peer_review", "source=checker,pay=audited", r"pay='audited', penalty=0.0, cross='none', verdict='sampled', plant_rate=0.0 act only with source=peer"),
    ("peer_review", "pay=vote", r"config.reward.pay='vote' is unknown; allowed: \['audited', 'audited_balanced', 'audited_team', 'peer_prediction'"),
])
def test_bad_experiment_arguments(name, arg, match):
  with pytest.raises(ValueError, match=match):
    _experiment(name).get_config(arg)


@pytest.mark.parametrize("name", ["single_agent", "solver_verifier", "vote", "best_of_n", "peer_review", "debate",
                                  "delegate", "tasks", "quickstart", "lm_solver_verifier"])
@pytest.mark.parametrize("size", ["cpu", "gpu"])
def test_every_experiment_size_builds(name, size):
  """The results and accelerator scales pass every check the CLI makes before compiling (the tests
  run only the tiny ones); a size=gpu language-model run needs its checkpoint."""
  arg = f"size={size}"
  if name == "lm_solver_verifier" and size == "gpu":
    with pytest.raises(ValueError, match="checkpoint is required at size=gpu"):
      _experiment(name).get_config(arg)
    arg += f",checkpoint={ROOT / 'tests' / 'fixtures' / 'lm' / 'llama'}"
  assert experiment.build(_experiment(name).get_config(arg)).layout.length > 0


# ---------------------------------------------------------------------------------------------
# Each experiment's tiny variant through the command line.

def _cli_rows(workdir, arg) -> list[dict]:
  """The metrics rows of `python -m marl_jax.main --config=experiments/ARG` run in `workdir`."""
  proc = subprocess.run([sys.executable, "-m", "marl_jax.main", f"--config=experiments/{arg}",
                         f"--workdir={workdir}"], cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_quickstart_tiny_through_the_cli(tmp_path):
  # The README's first command at the tiny size: a warm start, then joint RL with difference credit.
  rows = _cli_rows(tmp_path, "quickstart.py:size=tiny")
  assert rows[0]["step"] == 0 and rows[-1]["step"] == 4
  assert {"eval_accuracy", "eval_false_accept", "solver/influence", "verifier/influence"} <= set(rows[-1])


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["vote.py:size=tiny,aggregator=true,sharing=voters",
                                 "best_of_n.py:size=tiny,task=subset_sum",
                                 "debate.py:size=tiny,credit=difference",
                                 "debate.py:size=tiny,task=subset_sum,scorer=verifier"])
def test_tiny_workflow_through_the_cli(tmp_path, arg):
  rows = _cli_rows(tmp_path, arg)
  assert rows[-1]["step"] == 4 and 0 <= rows[-1]["eval_accuracy"] <= 1
  assert "same_message_rate" in rows[-1]
  if "sharing=voters" in arg:  # the voters share a set, the aggregator has its own
    assert rows[-1]["eval_voter0/next_token_js"] > 0 and rows[-1]["eval_aggregator/next_token_js"] > 0
  if "scorer=verifier" in arg:  # the verifier's set (1) is frozen after the warm start; the debaters' trains
    assert 0 <= rows[-1]["eval_verdict_accuracy"] <= 1
    config = _experiment("debate").get_config(arg.split(":")[1])
    config.num_devices = 1
    exp = experiment.build(config)
    params = {step: checkpoint.restore(str(tmp_path), state.abstract_state(exp), step).params for step in (0, 4)}
    set_params = lambda step, index: jax.tree.leaves(jax.tree.map(lambda p: np.asarray(p[:, index]), params[step]))
    assert all(np.array_equal(a, b) for a, b in zip(set_params(0, 1), set_params(4, 1)))
    assert any(not np.array_equal(a, b) for a, b in zip(set_params(0, 0), set_params(4, 0)))
