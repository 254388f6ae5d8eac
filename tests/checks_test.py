"""Range checks: every numeric setting is refused as `config.KEY=VALUE; allowed: WHAT`."""
import math

import pytest

from marl_jax import checks, credit, protocols, tasks


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "1", None])
def test_only_finite_numbers_pass(value):
  with pytest.raises(ValueError, match=r"^config.rl.x=.*; allowed: a number >= 0$"):
    checks.number("rl.x", value, 0)


def test_bounds_and_their_descriptions():
  checks.integer("a", 1, 1)
  checks.integer("a", 3, 1, 3)
  checks.number("a", 0.5, 0, below=1)
  checks.probability("a", 1)
  for call, message in [
      (lambda: checks.integer("a", 0, 1), "config.a=0; allowed: an integer >= 1"),
      (lambda: checks.integer("a", 1.0, 1), "config.a=1.0; allowed: an integer >= 1"),
      (lambda: checks.integer("a", 4, 1, 3, note="why"), "config.a=4; allowed: an integer in 1..3 (why)"),
      (lambda: checks.number("a", 0.0, 0.0, above=True), "config.a=0.0; allowed: a number > 0.0"),
      (lambda: checks.number("a", 1, 0, below=1), "config.a=1; allowed: a number in [0, 1)"),
      (lambda: checks.number("a", 0, 0, above=True, below=1), "config.a=0; allowed: a number in (0, 1)"),
      (lambda: checks.probability("a", 1.5), "config.a=1.5; allowed: a probability in [0, 1]")]:
    with pytest.raises(ValueError) as error:
      call()
    assert str(error.value) == message


ARITHMETIC = tasks.make("arithmetic")


@pytest.mark.parametrize("make, message", [
    # Each said "TASK needs A >= 1 and B >= 2; got Task(...)", naming neither the key nor which one.
    (lambda: tasks.make("hidden_sum", modulus=1), "config.task.modulus=1; allowed: an integer >= 2"),
    (lambda: tasks.make("arithmetic", max_operand=0), "config.task.max_operand=0; allowed: an integer >= 1"),
    (lambda: tasks.make("subset_sum", num_numbers=0), "config.task.num_numbers=0; allowed: an integer >= 1"),
    (lambda: tasks.make("multi_chain", num_chains=0), "config.task.num_chains=0; allowed: an integer >= 1"),
    (lambda: tasks.make("stack_program", num_examples=11),
     "config.task.num_examples=11; allowed: an integer in 1..10 (distinct inputs below config.task.modulus)"),
    (lambda: protocols.make("relay", ARITHMETIC, answer_len=1),
     "config.protocol.answer_len=1; allowed: 0 (the task's answer length) or an integer >= 2 (the task's)"),
    (lambda: protocols.make("relay", ARITHMETIC, agents=0), "config.protocol.agents=0; allowed: an integer >= 1"),
    (lambda: protocols.make("exchange", tasks.make("hidden_sum"), message_len=-1),
     "config.protocol.message_len=-1; allowed: an integer >= 0 (0: a full copy)"),
    (lambda: credit.make("role_baseline", decay=1.0).check(2, 2),
     "config.credit.decay=1.0; allowed: a number in [0, 1)"),
    (lambda: credit.make("difference", credit_weight=math.inf).check(2, 2),
     "config.credit.credit_weight=inf; allowed: a number >= 0.0"),
    # A NaN payoff was accepted, and every reward was NaN.
    (lambda: tasks.make("matrix_game", game="penalty", k=math.nan), "config.task.k=nan; allowed: a finite number"),
])
def test_settings_are_refused_by_their_key(make, message):
  with pytest.raises(ValueError) as error:
    make()
  assert str(error.value) == message
