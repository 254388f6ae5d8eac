"""Arithmetic task: hand examples of generation and scoring, token helpers, demonstrations, eval set."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import text
from marl_jax.tasks import base, eval_problems
from marl_jax.tasks.arithmetic import Arithmetic

D = lambda *digits: [text.DIGIT0 + d for d in digits]  # digit tokens
EOS, PAD = text.EOS, text.PAD
PLUS, MINUS, TIMES = 0, 1, 2  # op ids, in Arithmetic's OPS order


def test_evaluate_a_chain_left_to_right():
  task = Arithmetic(num_ops=3)
  # ((3 + 4) * 2 - 5) mod 10: 7, 14 -> 4, -1 -> 9; without the last op: 4.
  value, before_last = task.evaluate(jnp.array([3, 4, 2, 5]), jnp.array([PLUS, TIMES, MINUS]))
  assert (int(value), int(before_last)) == (9, 4)
  # One op: 7 * 5 = 35 -> 5; the 'mistake' is the first operand itself.
  value, before_last = Arithmetic(num_ops=1).evaluate(jnp.array([7, 5]), jnp.array([TIMES]))
  assert (int(value), int(before_last)) == (5, 7)
  # Modulus 7: (6 + 6) mod 7 = 5, then 5 * 3 = 15 mod 7 = 1.
  value, _ = Arithmetic(num_ops=2, modulus=7).evaluate(jnp.array([6, 6, 3]), jnp.array([PLUS, TIMES]))
  assert int(value) == 1


def test_lengths():
  assert (Arithmetic(num_ops=2).prompt_len, Arithmetic(num_ops=2).answer_len) == (7, 2)
  # Two-digit operands: '<bos>' 3 x 2 digits, 2 ops, '=' -> 10; answers up to 99: 2 digits + EOS.
  assert Arithmetic(num_ops=2, max_operand=12, modulus=100).prompt_len == 10
  assert Arithmetic(num_ops=2, max_operand=12, modulus=100).answer_len == 3


def test_score_by_hand():
  task = Arithmetic(num_ops=3)
  problem = {"prompt": jnp.array(text.encode("<bos>3+4*2-5=")),
             "answer": jnp.array(D(9) + [EOS]), "mistake": jnp.array(D(4) + [EOS])}
  score = lambda msg: float(task.score(problem, jnp.array(msg)))
  assert score(D(9) + [EOS]) == 1.0
  assert score(D(4) + [EOS]) == 0.0  # the systematic mistake
  assert score(D(9) + [PAD]) == 0.0  # an unterminated answer is not the answer
  assert score(D(9, 9)) == 0.0
  # Longer answers: whatever follows the first EOS is ignored.
  task = Arithmetic(num_ops=1, modulus=100)
  problem = {"answer": jnp.array(D(7) + [EOS, PAD])}
  assert float(task.score(problem, jnp.array(D(7) + [EOS] + D(5)))) == 1.0
  assert float(task.score(problem, jnp.array(D(0, 7) + [EOS]))) == 0.0  # no leading zeros


def test_number_tokens():
  np.testing.assert_array_equal(base.number_tokens(jnp.int32(7), 2), D(7) + [EOS, PAD])
  np.testing.assert_array_equal(base.number_tokens(jnp.int32(42), 2), D(4, 2) + [EOS])
  np.testing.assert_array_equal(base.number_tokens(jnp.int32(0), 2), D(0) + [EOS, PAD])
  np.testing.assert_array_equal(base.number_tokens(jnp.int32(305), 3), D(3, 0, 5) + [EOS])
  np.testing.assert_array_equal(base.number_tokens(jnp.int32(5), 1), D(5) + [EOS])


def test_fixed_width_tokens():
  np.testing.assert_array_equal(base.fixed_width_tokens(jnp.int32(7), 2), D(0, 7))
  np.testing.assert_array_equal(base.fixed_width_tokens(jnp.int32(42), 2), D(4, 2))
  np.testing.assert_array_equal(base.fixed_width_tokens(jnp.int32(3), 1), D(3))


def test_canonical():
  np.testing.assert_array_equal(base.canonical(jnp.array(D(1) + [EOS] + D(3) + [EOS])),
                                D(1) + [EOS, PAD, PAD])
  np.testing.assert_array_equal(base.canonical(jnp.array(D(1, 2, 3))), D(1, 2, 3))  # no EOS: as is
  np.testing.assert_array_equal(base.canonical(jnp.array([EOS] + D(2))), [EOS, PAD])


def _python_chain(prompt_text, modulus):
  """Left-to-right value of 'a+b*c=' in plain Python, and the value before the last op."""
  values, ops, number = [], [], ""
  for ch in prompt_text.removeprefix("<bos>"):
    if ch.isdigit():
      number += ch
    else:
      values.append(int(number))
      number = ""
      ops.append(ch)
  acc, partial = values[0] % modulus, []
  for op, b in zip(ops[:-1], values[1:]):  # the last 'op' is '='
    acc = {"+": acc + b, "-": acc - b, "*": acc * b}[op] % modulus
    partial.append(acc)
  return acc, ([values[0] % modulus] + partial)[-2]


@functools.cache
def _sample(task, n=64, seed=0):
  return task.sample_batch(jax.random.split(jax.random.PRNGKey(seed), n))


@pytest.mark.parametrize("task", [Arithmetic(num_ops=3),
                                  Arithmetic(num_ops=2, max_operand=12, modulus=100),
                                  Arithmetic(num_ops=3, ops="+*")])
def test_sample_matches_a_python_evaluation(task):
  problems = _sample(task)
  chex.assert_shape(problems["prompt"], (64, task.prompt_len))
  chex.assert_shape([problems["answer"], problems["mistake"]], (64, task.answer_len))
  assert problems["prompt"].dtype == jnp.int32
  width = task.operand_width
  for prompt, answer, mistake in zip(*(np.asarray(problems[k]) for k in ("prompt", "answer", "mistake"))):
    s = text.decode(prompt)
    assert s.startswith("<bos>") and s.endswith("=") and len(prompt) == task.prompt_len
    operands = s[5:-1].replace("+", " ").replace("-", " ").replace("*", " ").split()
    assert len(operands) == task.num_ops + 1 and all(len(o) == width for o in operands)
    assert all(0 <= int(o) <= task.max_operand for o in operands)
    value, before_last = _python_chain(s, task.modulus)
    np.testing.assert_array_equal(answer, base.number_tokens(jnp.int32(value), task.answer_len - 1))
    assert base.parse_number(answer) == (value, True) and base.parse_number(mistake) == (before_last, True)
  # Every allowed operation and operand shows up, and nothing else: the draws are not stuck.
  prompts = [text.decode(prompt)[5:-1] for prompt in np.asarray(problems["prompt"])]
  assert set("".join(prompts)) - set("0123456789") == set(task.ops)
  operands = {int(o) for s in prompts for o in s.replace("+", " ").replace("-", " ").replace("*", " ").split()}
  assert operands == set(range(task.max_operand + 1))


def test_render():
  task = Arithmetic(num_ops=3)
  problem = {"prompt": jnp.array(text.encode("<bos>3+4*2-5=")), "answer": jnp.array(D(9) + [EOS])}
  assert task.render(problem) == "<bos>3+4*2-5= 9<eos>"


def test_demonstrations():
  problems = _sample(Arithmetic(num_ops=2))
  keys = jax.random.split(jax.random.PRNGKey(3), 64)
  demo = lambda rate: jax.vmap(Arithmetic(num_ops=2, demo_error_rate=rate).demonstrate)(problems, keys)
  np.testing.assert_array_equal(demo(0.0), problems["answer"])  # always right
  np.testing.assert_array_equal(demo(1.0), problems["mistake"])  # always the systematic mistake
  # In between, a mix of exactly those two.
  half = np.asarray(demo(0.5))
  is_answer = (half == np.asarray(problems["answer"])).all(1)
  is_mistake = (half == np.asarray(problems["mistake"])).all(1)
  assert np.all(is_answer | is_mistake)
  assert 0 < (~is_answer).sum() < 64
  # Correct demonstrations score 1; mistakes score 0 unless the last op left the value unchanged.
  score = jax.vmap(Arithmetic(num_ops=2).score)
  same = (np.asarray(problems["answer"]) == np.asarray(problems["mistake"])).all(1)
  np.testing.assert_array_equal(score(problems, demo(0.0)), np.ones(64))
  np.testing.assert_array_equal(score(problems, demo(1.0)), same.astype(np.float32))
  assert same.mean() < 0.5


def test_eval_set_is_reproducible_from_its_seed():
  task = Arithmetic(num_ops=2)
  a, b = eval_problems(task, 1234, 32), eval_problems(task, 1234, 32)
  chex.assert_trees_all_equal(a, b)
  assert not np.array_equal(a["prompt"], eval_problems(task, 1235, 32)["prompt"])


def test_invalid_settings():
  with pytest.raises(ValueError, match=r"config.task.num_ops=0; allowed: an integer >= 1"):
    Arithmetic(num_ops=0)
  with pytest.raises(ValueError, match=r"config.task.modulus=1; allowed: an integer >= 2"):
    Arithmetic(modulus=1)
