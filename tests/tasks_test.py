"""The task suite: generation and scoring on hand-worked examples, the stack interpreter, matrix-game
payoffs, the registry, demonstrations, every task on its protocols with a tiny model, and end-to-end
runs through the real CLI."""
import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import model as model_lib
from marl_jax import experiment, protocols, sampling, tasks, text
from marl_jax.protocols import engine
from marl_jax.tasks import base
from marl_jax.tasks.hidden_sum import HiddenSum
from marl_jax.tasks.matrix_game import MatrixGame
from marl_jax.tasks.multi_chain import MultiChain
from marl_jax.tasks.stack_program import StackProgram
from marl_jax.tasks.subset_sum import SubsetSum
from marl_jax.tasks.arithmetic import Arithmetic
from workflows_test import compiled_demonstrate, compiled_rewards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_TASKS = ("subset_sum", "hidden_sum", "multi_chain", "stack_program", "matrix_game", "contribution",
             "signalling")
# Every task on each protocol that makes sense for it.
PAIRS = [("subset_sum", "single"), ("subset_sum", "solver_verifier"), ("hidden_sum", "single"),
         ("hidden_sum", "exchange"), ("multi_chain", "single"), ("multi_chain", "orchestrator"), ("stack_program", "single"),
         ("matrix_game", "single"), ("matrix_game", "matrix_game"), ("contribution", "single"),
         ("contribution", "contribution"), ("signalling", "exchange")]


def tokens(s: str):
  return jnp.asarray(text.encode(s), jnp.int32)


@functools.cache
def problems(task, n=256, seed=0):
  return jax.device_get(tasks.eval_problems(task, seed, n))


def row(batch, i):
  return jax.tree.map(lambda x: x[i], batch)


# ---------------------------------------------------------------------------------------------
# Registry.


def test_registry_names_every_task_and_rejects_unknown_names_and_knobs():
  assert set(NEW_TASKS) <= set(tasks.REGISTRY)
  with pytest.raises(ValueError, match="is unknown; allowed: .*'hidden_sum'.*'matrix_game'.*'subset_sum'"):
    tasks.make("sudoku")
  with pytest.raises(ValueError, match=r"keys \['num_ops'\] .*'subset_sum'.*allowed: .*num_numbers"):
    tasks.make("subset_sum", num_ops=3)
  with pytest.raises(ValueError, match="config.task.game='chicken'.*climbing"):
    tasks.make("matrix_game", game="chicken")
  assert tasks.make("stack_program", num_ops=3).answer_len == 8


# ---------------------------------------------------------------------------------------------
# Generation and scoring on hand-worked examples.


def test_subset_sum_scores_any_valid_subset():
  task = SubsetSum(num_numbers=5, max_number=9)
  problem = {"prompt": tokens("<bos>3,7,1,5,8=16"), "numbers": jnp.array([3, 7, 1, 5, 8]),
             "target": jnp.array(16), "answer": tokens("10011<eos>")}
  score = lambda s: float(task.score(problem, tokens(s)))
  assert score("10011<eos>") == 1.0  # 3 + 5 + 8
  assert score("01101<eos>") == 1.0  # 7 + 1 + 8: another subset counts too
  assert score("11000<eos>") == 0.0  # 10
  assert score("1a011<eos>") == 0.0 and score("100111") == 0.0  # malformed: a letter; no EOS
  assert score("1001<eos><pad>") == 0.0


def test_subset_sum_generation():
  task = SubsetSum(num_numbers=5, max_number=9)
  batch = problems(task)
  for i in range(20):
    p = row(batch, i)
    numbers, target = text.decode(p["prompt"])[5:].split("=")
    assert [int(n) for n in numbers.split(",")] == p["numbers"].tolist() and int(target) == p["target"]
    mask = [c == "1" for c in text.decode(p["answer"]).removesuffix("<eos>")]
    assert any(mask) and sum(np.array(mask) * p["numbers"]) == p["target"]
  assert np.all(jax.vmap(task.score)(batch, batch["answer"]) == 1.0)
  assert np.all(jax.vmap(task.score)(batch, batch["mistake"]) == 0.0)  # one number short
  # The mistake leaves out the last chosen number: the answer's last '1' becomes '0'.
  for i in range(20):
    answer = text.decode(row(batch, i)["answer"])
    last = answer.rindex("1")
    assert text.decode(row(batch, i)["mistake"]) == answer[:last] + "0" + answer[last + 1:]
  # Numbers are drawn from 1..max_number.
  wide = problems(SubsetSum(num_numbers=5, max_number=50))
  numbers = [int(n) for i in range(20) for n in text.decode(row(wide, i)["prompt"])[5:].split("=")[0].split(",")]
  assert min(numbers) >= 1 and max(numbers) <= 50 and len({n for n in numbers if n > 9}) >= 10


def test_hidden_sum():
  task = HiddenSum(max_number=99, modulus=100)
  problem = {"prompt": tokens("<bos>37+85="), "answer": tokens("22<eos>")}
  assert float(task.score(problem, tokens("22<eos>"))) == 1.0  # (37 + 85) mod 100
  assert float(task.score(problem, tokens("85<eos>"))) == 0.0
  assert float(task.score(problem, tokens("122"))) == 0.0
  assert [name for name, _ in task.prompt_segments] == ["header", "part_a", "part_b", "query"]
  batch = problems(task)
  for i in range(20):
    a, b = text.decode(batch["prompt"][i])[5:-1].split("+")
    assert text.decode(batch["answer"][i]) == f"{(int(a) + int(b)) % 100}<eos>"
    assert text.decode(batch["mistake"][i]) == f"{int(b)}<eos>"  # the receiver's own number
  # a and b are drawn from 0..max_number, both ends included: with ten values, 256 problems hold each.
  small = problems(HiddenSum(max_number=9, modulus=10))
  a_B, b_B = small["prompt"][:, 1] - text.DIGIT0, small["prompt"][:, 3] - text.DIGIT0
  assert set(a_B.tolist()) == set(b_B.tolist()) == set(range(10))


def chain_value(chain: str, modulus: int) -> int:
  """Reference: a chain evaluated left to right, mod `modulus` after every step."""
  value, op = 0, "+"
  for c in chain:
    if c.isdigit():
      value = {"+": value + int(c), "-": value - int(c), "*": value * int(c)}[op] % modulus
    else:
      op = c
  return value


def test_multi_chain():
  # 3*8*0 = 0; 2*9-4 = 18-4 = 4 (mod 10: 8-4); 0*9-6 = -6 = 4 (mod 10); 0+4+4 = 8.
  assert [chain_value(c, 10) for c in ("3*8*0", "2*9-4", "0*9-6")] == [0, 4, 4]
  task = MultiChain(num_chains=3, num_ops=2)
  batch = problems(task)
  assert batch["prompt"].shape[1] == 1 + 3 * 6 == task.prompt_len
  for i in range(50):
    chains = text.decode(batch["prompt"][i])[5:-1].split(",")
    values = [chain_value(c, 10) for c in chains]
    assert batch["part_values"][i].tolist() == values
    # A worker's mistake: its chain's last operation (an operator and a one-digit operand) dropped.
    assert batch["part_mistakes"][i].tolist() == [chain_value(c[:-2], 10) for c in chains]
    assert text.decode(batch["answer"][i]) == f"{sum(values) % 10}<eos>"
    assert text.decode(batch["mistake"][i]) == f"{sum(values[:-1]) % 10}<eos>"  # last chain lost
  assert dict(task.prompt_segments)["chain2"] == 6
  # The sum is taken mod the modulus, not just cut to the answer's digits: 5 + 6 = 11 = 4 (mod 7).
  assert int(MultiChain(modulus=7).combine(jnp.array([5, 6]))) == 4
  seven = problems(MultiChain(modulus=7))
  sums_B = seven["part_values"].sum(1)
  assert (sums_B >= 7).any()
  assert [text.decode(a) for a in seven["answer"]] == [f"{v % 7}<eos>" for v in sums_B]


def test_stack_interpreter_on_hand_written_programs():
  task = StackProgram(num_ops=2, modulus=10)
  run_jit = jax.jit(task.run)
  run = lambda program, x: tuple(int(v) for v in run_jit(tokens(program), x))
  assert run("x1d+-<eos>", 4) == (2, 1)  # 4 1 1 -> 4 2 -> 2
  assert run("xd*<eos>", 4) == (6, 1)  # 16 mod 10
  assert run("x5s-<eos>", 7) == (8, 1)  # 5 - 7 = -2 mod 10
  assert run("x3<eos>", 7) == (3, 1)  # the output is the top of the stack
  assert run("x<eos>5", 7) == (7, 1)  # nothing after EOS runs
  assert run("x9*", 7) == (3, 1)  # a slot without EOS ends the program
  assert run("+<eos>", 7)[1] == 0  # stack underflow
  assert run("xs<eos>", 7)[1] == 0
  assert run("xq<eos>", 7)[1] == 0  # not an instruction
  assert run("<eos>", 7)[1] == 0  # empty stack at the end
  squares = {"outputs": jnp.array([x * x % 10 for x in range(10)])}
  assert float(task.score(squares, tokens("xd*<eos>"))) == 1.0
  assert float(task.score(squares, tokens("xx*<eos><pad><pad>"))) == 1.0  # another program counts
  assert float(task.score(squares, tokens("xd+<eos>"))) == 0.0


def test_stack_program_generation():
  task = StackProgram(num_ops=2, num_examples=4, modulus=10)
  batch = problems(task)
  ok = jax.vmap(jax.vmap(task.run, in_axes=(None, 0)), in_axes=(0, None))(batch["answer"], jnp.arange(10))[1]
  assert np.all(ok) and np.all(batch["answer"][:, 0] == text.TOKEN_ID["x"])
  for i in range(20):
    examples = text.decode(batch["prompt"][i])[5:-1].split(",")
    for example in examples:
      x, y = example.split(":")
      assert batch["outputs"][i, int(x)] == int(y)
    assert len(set(examples)) == 4  # distinct inputs
  assert np.all(jax.vmap(task.score)(batch, batch["answer"]) == 1.0)
  assert np.mean(jax.vmap(task.score)(batch, batch["mistake"])) < 0.3  # the last op swapped
  # Every program has num_ops + 1 pushes and num_ops operations, so it ends on an operation (the one
  # the mistake swaps) with one value left on the stack.
  program_BxL = batch["answer"][:, :-1]
  ops_BxL = np.isin(program_BxL, [text.PLUS, text.MINUS, text.TIMES])
  np.testing.assert_array_equal(ops_BxL.sum(1), 2)
  assert ops_BxL[:, -1].all()


def test_matrix_game_payoffs_and_scores():
  payoffs = lambda **kwargs: MatrixGame(**kwargs).payoffs().tolist()
  assert payoffs(game="climbing") == [[11, -30, 0], [-30, 7, 6], [0, 0, 5]]
  assert payoffs(game="penalty", k=-50) == [[10, 0, -50], [0, 2, 0], [-50, 0, 10]]
  assert payoffs(game="nonmonotonic") == [[8, -12, -12], [-12, 0, 0], [-12, 0, 0]]
  climbing, penalty = MatrixGame(game="climbing"), MatrixGame(game="penalty", k=-100)
  p = row(problems(climbing, 4), 0)
  score = lambda task, s: float(task.score(p, tokens(s)))
  assert score(climbing, "00<eos>") == 1.0 and score(climbing, "01<eos>") == 0.0
  assert score(climbing, "22<eos>") == pytest.approx((5 + 30) / 41)
  # The first action is the row player's: climbing's one asymmetric pair of cells, (1, 2) = 6, (2, 1) = 0.
  assert score(climbing, "12<eos>") == pytest.approx(36 / 41) and score(climbing, "21<eos>") == pytest.approx(30 / 41)
  assert score(penalty, "11<eos>") == pytest.approx(102 / 110) and score(penalty, "22<eos>") == 1.0
  assert score(climbing, "3<eos>") == 0.0 and score(climbing, "a1") == 0.0  # not actions
  # Answers are optima; mistakes are the best responses to a uniform partner.
  for game, mistake in (("climbing", "22"), ("penalty", "11"), ("nonmonotonic", "11")):
    batch = problems(MatrixGame(game=game), 4)
    assert text.decode(batch["prompt"][0]) == f"<bos>{game[0]}"
    assert text.decode(batch["answer"][0]) == "00<eos>"
    assert text.decode(batch["mistake"][0]) == f"{mistake}<eos>"


# ---------------------------------------------------------------------------------------------
# Protocols: demonstrations, rollouts with a tiny model, and hidden information.


CFG = model_lib.ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=40)


def setup(task_name, protocol_name, **task_kwargs):
  task = tasks.make(task_name, **task_kwargs)
  protocol = protocols.make(protocol_name, task)
  return task, protocol, protocol.layout(task, tuple(range(len(protocol.roles))))


@pytest.mark.parametrize("task_name,protocol_name", PAIRS)
def test_demonstrations_are_right_without_noise(task_name, protocol_name):
  task, protocol, layout = setup(task_name, protocol_name, demo_error_rate=0.0)
  if protocol_name == "solver_verifier":
    protocol = protocols.make(protocol_name, task, verifier_demo_error_rate=0.0)
  batch = problems(task, 64)
  demos_BxT = compiled_demonstrate(protocol, task, layout, batch, jax.random.split(jax.random.PRNGKey(1), 64))
  chex.assert_shape(demos_BxT, (64, layout.length))
  np.testing.assert_array_equal(compiled_rewards(protocol, task, layout, batch, demos_BxT).team_B, 1.0)
  # With only mistakes, systematic mistakes are (almost always) wrong.
  noisy = tasks.make(task_name, demo_error_rate=1.0)
  demos_BxT = compiled_demonstrate(protocol, noisy, layout, batch, jax.random.split(jax.random.PRNGKey(1), 64))
  assert compiled_rewards(protocol, noisy, layout, batch, demos_BxT).team_B.mean() < 0.9


SUBSET_RATES = ("false_accept", "false_reject", "judge_precision", "fix_rate", "break_rate", "worker_accuracy",
                "spurious_parallelism")


@pytest.mark.parametrize("task_name,protocol_name", PAIRS)
def test_rollout_with_a_tiny_model(task_name, protocol_name):
  task, protocol, layout = setup(task_name, protocol_name)
  B = 8
  batch = problems(task, B)
  params_R = model_lib.init_stack(CFG, jax.random.PRNGKey(0), len(protocol.roles))
  canvas_BxT = engine.assemble(layout, batch["prompt"], [None] * len(layout.turn_slices))

  @jax.jit
  def rollout_and_score(params_R, canvas_BxT):
    tokens_BxT, logp_BxT, _ = sampling.generate(CFG, layout, params_R, canvas_BxT,
                                                jnp.zeros(canvas_BxT.shape, bool),
                                                jax.random.split(jax.random.PRNGKey(2), B), 1.0)
    return tokens_BxT, logp_BxT, protocol.rewards(task, layout, batch, tokens_BxT)

  tokens_BxT, logp_BxT, rewards = rollout_and_score(params_R, canvas_BxT)
  chex.assert_shape([tokens_BxT, logp_BxT], (B, layout.length))
  chex.assert_shape(rewards.role_RxB, (len(protocol.roles), B))
  # Rewards are finite; a diagnostic over a subset the batch lacks (no right answer to reject) is NaN.
  chex.assert_tree_all_finite(rewards.replace(metrics={k: v for k, v in rewards.metrics.items()
                                                        if k not in SUBSET_RATES}))
  assert np.all((rewards.team_B >= 0) & (rewards.team_B <= 1))
  assert 0 <= rewards.metrics["accuracy"] <= 1
  np.testing.assert_array_equal(tokens_BxT[:, :task.prompt_len], batch["prompt"])


def test_exchange_layout_hides_each_part_from_one_role():
  task, protocol, layout = setup("hidden_sum", "exchange")
  assert protocol.roles == ("sender", "receiver") and protocol.message_len == 3  # 2 digits + EOS
  visible = dict(zip(layout.segment_names, layout.visible_SxR.tolist()))
  assert visible["part_a"] == [True, False] and visible["part_b"] == [False, True]
  assert visible["sender0"] == [True, True] and visible["header"] == [True, True]
  with pytest.raises(ValueError, match="prompt segment 'part_a'"):
    protocols.make("exchange", SubsetSum())


def test_exchange_rewards_both_roles_with_the_team_outcome():
  # The receiver's answer is final; neither role has a signal of its own, so both get the team outcome.
  task, protocol, layout = setup("hidden_sum", "exchange")
  prompt_BxP = jnp.stack([tokens("<bos>37+85=")] * 3)  # (37 + 85) mod 100 = 22
  batch = {"prompt": prompt_BxP, "answer": jnp.stack([tokens("22<eos>")] * 3)}
  messages = [("37<eos>", "22<eos>"),  # right
              ("37<eos>", "85<eos>"),  # the receiver's own number: wrong
              ("<absent><eos><pad>", "22<eos>")]  # a right guess without a message still counts
  canvas_BxT = jnp.stack([engine.assemble(layout, prompt_BxP[:1], [tokens(m)[None] for m in ms])[0]
                          for ms in messages])
  rewards = compiled_rewards(protocol, task, layout, batch, canvas_BxT)
  np.testing.assert_array_equal(rewards.team_B, [1, 0, 1])
  np.testing.assert_array_equal(rewards.role_RxB, [[1, 0, 1], [1, 0, 1]])
  assert float(rewards.metrics["accuracy"]) == pytest.approx(2 / 3)


def best_guess_accuracy(task, segment: str) -> float:
  """Accuracy of the best answer given only one prompt segment: a lookup table (the most frequent
  answer for each value of the segment) fitted on many problems, scored on fresh ones."""
  start = sum(n for name, n in task.prompt_segments[:[s for s, _ in task.prompt_segments].index(segment)])
  stop = start + dict(task.prompt_segments)[segment]
  fit, test = problems(task, 8192, seed=1), problems(task, 2048, seed=2)
  key = lambda batch: [tuple(p) for p in batch["prompt"][:, start:stop]]
  counts = {}
  for k, answer in zip(key(fit), map(tuple, fit["answer"])):
    counts.setdefault(k, {}).setdefault(answer, 0)
    counts[k][answer] += 1
  best = {k: max(c, key=c.get) for k, c in counts.items()}
  return float(np.mean([best.get(k) == tuple(a) for k, a in zip(key(test), test["answer"])]))


def test_no_role_of_the_exchange_can_answer_alone():
  # Alone, the best possible sender or receiver guesses: right 1 / modulus of the time.
  task = HiddenSum(max_number=9, modulus=10)
  assert best_guess_accuracy(task, "part_a") < 0.15 and best_guess_accuracy(task, "part_b") < 0.15
  # A receiver's answer depends on nothing it cannot read: changing part_a (with the message fixed,
  # here <absent>) leaves its greedy answer unchanged, so without a message it can only guess.
  task, protocol, layout = setup("hidden_sum", "exchange", max_number=9, modulus=10)
  batch = problems(task, 16)
  other_a = batch["prompt"].copy()
  other_a[:, 1] = text.DIGIT0 + (other_a[:, 1] - text.DIGIT0 + 3) % 10
  assert not np.array_equal(other_a, batch["prompt"])
  params_R = model_lib.init_stack(CFG, jax.random.PRNGKey(0), 2)
  absent_Bx2 = jnp.tile(jnp.array([[text.ABSENT, text.EOS]]), (16, 1))
  sender = layout.turn_slices[0]

  @jax.jit
  def receiver_answer(prompt_BxP):
    canvas_BxT = engine.assemble(layout, prompt_BxP, [absent_Bx2, None])
    force_BxT = jnp.zeros(canvas_BxT.shape, bool).at[:, sender[0]:sender[1]].set(True)
    tokens_BxT, _, _ = sampling.generate(CFG, layout, params_R, canvas_BxT, force_BxT,
                                         jax.random.split(jax.random.PRNGKey(0), 16), 1.0, greedy=True)
    return engine.message(layout, tokens_BxT, 1)

  np.testing.assert_array_equal(receiver_answer(batch["prompt"]), receiver_answer(other_a))
  # ...while the copying sender of the demonstrations makes a right receiver possible.
  demos_BxT = compiled_demonstrate(protocol, HiddenSum(max_number=9, modulus=10, demo_error_rate=0.0), layout, batch,
                                   jax.random.split(jax.random.PRNGKey(0), 16))
  assert [text.decode(m) for m in engine.message(layout, demos_BxT, 0)[:2]] == [
      f"{text.decode(p[1:2])}<eos>" for p in batch["prompt"][:2]]


def test_parse_number():
  parse = lambda s: tuple(int(v) for v in base.parse_number(tokens(s)))
  assert parse("12<eos><pad>") == (12, 1) and parse("0<eos>") == (0, 1) and parse("7<eos>3") == (7, 1)
  assert parse("<eos>1")[1] == 0 and parse("1+<eos>")[1] == 0 and parse("12")[1] == 0


def test_orchestrator_layout_workers_read_only_their_part():
  task, protocol, layout = setup("multi_chain", "orchestrator", num_chains=3)
  assert protocol.roles == ("orchestrator", "worker0", "worker1", "worker2")
  visible = dict(zip(layout.segment_names, layout.visible_SxR.tolist()))
  #                       orchestrator worker0 worker1 worker2
  assert visible["header"] == [True, True, True, True]
  assert visible["chain1"] == [True, False, True, False]
  assert visible["worker10"] == [True, False, True, False]  # worker1's report
  assert layout.turn_roles == (1, 2, 3, 0)  # workers first, the orchestrator last
  with pytest.raises(ValueError, match="decomposable task .*SubsetSum has none"):
    protocols.make("orchestrator", SubsetSum())
  with pytest.raises(ValueError, match="8 role markers"):
    protocols.make("orchestrator", MultiChain(num_chains=8))


def test_orchestrator_rewards_by_hand():
  task, protocol, layout = setup("multi_chain", "orchestrator")  # two chains, mod 10
  prompts = ["<bos>3*4,2+5=", "<bos>3*4,2+5=", "<bos>3*4,2+5=", "<bos>9-2,8+8="]
  # values 2, 7 -> 9          7, 6 -> 3
  batch = {"prompt": jnp.stack([tokens(p) for p in prompts]),
           "answer": jnp.stack([tokens("9<eos>")] * 3 + [tokens("3<eos>")]),
           "part_values": jnp.array([[2, 7]] * 3 + [[7, 6]])}
  #           worker0       worker1        orchestrator    team  workers  orchestrator's own signal
  messages = [("2<eos>", "7<eos>", "9<eos>"),  # 1     1 1      1 (the reports combined)
              ("2<eos>", "6<eos>", "8<eos>"),  # 0     1 0      1 (faithful to a wrong report)
              ("2<eos>", "6<eos>", "9<eos>"),  # 1     1 0      0 (right, but not what it was told)
              ("7<eos>", "+<eos>", "3<eos>")]  # 1     1 0      1 (a report unreadable: the answer)
  canvas_BxT = jnp.stack([engine.assemble(layout, batch["prompt"][i:i + 1],
                                          [tokens(m)[None] for m in ms])[0] for i, ms in enumerate(messages)])
  rewards = compiled_rewards(protocol, task, layout, batch, canvas_BxT)
  np.testing.assert_array_equal(rewards.team_B, [1, 0, 1, 1])
  np.testing.assert_array_equal(rewards.role_RxB, [[1, 1, 0, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
  assert float(rewards.metrics["worker_accuracy"]) == 5 / 8
  assert float(rewards.metrics["aggregation_accuracy"]) == 3 / 4
  assert float(rewards.metrics["critical_tokens"]) == 4  # a 2-token report, then a 2-token answer


def test_matrix_game_protocol_plays_simultaneously():
  task, protocol, layout = setup("matrix_game", "matrix_game", game="penalty")
  visible = dict(zip(layout.segment_names, layout.visible_SxR.tolist()))
  assert visible["row0"] == [True, False] and visible["column0"] == [False, True]
  batch = problems(task, 3)
  messages = [[tokens("2<eos>"), tokens("1<eos>")], [tokens("0<eos>"), tokens("0<eos>")],
              [tokens("2<eos>"), tokens("2<eos>")]]
  canvas_BxT = jnp.stack([engine.assemble(layout, batch["prompt"][:1], [m[None] for m in ms])[0]
                          for ms in messages])
  rewards = compiled_rewards(protocol, task, layout, batch, canvas_BxT)
  np.testing.assert_allclose(rewards.team_B, [100 / 110, 1.0, 1.0], rtol=1e-6)
  np.testing.assert_array_equal(rewards.role_RxB, np.stack([rewards.team_B] * 2))
  assert float(rewards.metrics["optimal"]) == pytest.approx(2 / 3)
  assert float(rewards.metrics["payoff"]) == pytest.approx(20 / 3, rel=1e-5)
  with pytest.raises(ValueError, match="joint action"):
    protocols.make("matrix_game", SubsetSum())


# ---------------------------------------------------------------------------------------------
# The experiment config, and end-to-end runs through the real CLI.


def load_config(arg):
  spec = importlib.util.spec_from_file_location("tasks_config", os.path.join(ROOT, "experiments/tasks.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.mark.parametrize("task_name", NEW_TASKS + ("arithmetic",))
def test_config_builds_for_every_size(task_name):
  for size in ("tiny", "cpu", "gpu"):
    config = load_config(f"task={task_name},size={size}")
    config.num_devices = 1
    exp = experiment.build(config)
    assert exp.layout.length <= config.model.max_len
  with pytest.raises(ValueError, match="allowed: .*'stack_program'"):
    load_config("task=tetris")
  with pytest.raises(ValueError, match="protocol='auction' is unknown; allowed: .*'solver_verifier'"):
    load_config(f"task={task_name},protocol=auction")


def test_a_newly_registered_task_runs_from_the_config_on_single(monkeypatch):
  # A new task is its file: experiments/tasks.py runs it on `single` at its defaults, unlisted in TASKS.
  class Countdown(Arithmetic):
    name = "countdown"
  monkeypatch.setitem(tasks.REGISTRY, "countdown", dataclasses.dataclass(frozen=True)(Countdown))
  for size in ("tiny", "gpu"):
    config = load_config(f"task=countdown,size={size}")
    assert config.task.to_dict() == {"name": "countdown", **tasks.knobs("arithmetic")}
    assert config.protocol.name == "single"
  config.num_devices = 1
  assert experiment.build(config).layout.roles == ("agent",)
  with pytest.raises(ValueError, match="allowed: .*'countdown'"):
    load_config("task=tetris")


def test_config_exposes_the_protocol_knobs():
  config = load_config("task=subset_sum,protocol=solver_verifier,size=tiny")
  assert (config.protocol.rounds, config.protocol.verifier_demo_error_rate) == (1, 0.2)
  config.protocol.rounds, config.model.max_len, config.num_devices = 2, 48, 1
  assert len(experiment.build(config).layout.turn_slices) == 4
  config.model.max_len = 32  # two rounds do not fit: the error says how many tokens they need
  with pytest.raises(ValueError, match="config.model.max_len=32 is too short: prompt plus messages take 43 tokens"):
    experiment.build(config)


@pytest.mark.slow
# Through the real CLI for two tasks whose protocols run parallel turns (workers; one turn per role);
# every task's demonstrations and rollouts on each of its protocols are checked in-process above, and
# the loop itself by every other end-to-end test, so a CLI run per task only cost CI time.
@pytest.mark.parametrize("task_name", ["multi_chain", "contribution"])
def test_end_to_end_tiny_training(tmp_path, task_name):
  workdir = str(tmp_path / task_name)
  proc = subprocess.run([sys.executable, "-m", "marl_jax.main",
                         f"--config=experiments/tasks.py:task={task_name},size=tiny", f"--workdir={workdir}"],
                        cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert rows[-1]["step"] == 4 and 0 <= rows[-1]["eval_accuracy"] <= 1
