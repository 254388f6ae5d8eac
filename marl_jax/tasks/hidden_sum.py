"""Hidden sum: `a+b=`, answer (a + b) mod `modulus`, with a and b in separate prompt segments.

The `exchange` protocol hides `part_b` from the sender and `part_a` from the receiver, so neither can
answer alone: with a uniform over whole periods of the modulus, the answer given only b (or only a) is
uniform, and the best guess is right 1 / modulus of the time.  They must communicate.
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.tasks import base


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: the base's demo_error_rate comes first
class HiddenSum(base.Task):
  name: ClassVar[str] = "hidden_sum"
  max_number: int = 99  # a and b are drawn from 0..max_number
  modulus: int = 100
  demo_error_rate: float = 0.4

  def __post_init__(self):
    checks.integer("task.max_number", self.max_number, 1)
    checks.integer("task.modulus", self.modulus, 2)

  @property
  def width(self) -> int:
    return len(str(self.max_number))

  @property
  def prompt_segments(self) -> tuple[tuple[str, int], ...]:
    return (("header", 1), ("part_a", self.width), ("part_b", 1 + self.width), ("query", 1))

  @property
  def prompt_len(self) -> int:
    return sum(n for _, n in self.prompt_segments)

  @property
  def answer_len(self) -> int:
    return len(str(self.modulus - 1)) + 1

  def sample(self, key) -> dict:
    a, b = jax.random.randint(key, (2,), 0, self.max_number + 1)
    digits = lambda x: base.fixed_width_tokens(x, self.width)
    prompt = jnp.concatenate([jnp.array([text.BOS]), digits(a), jnp.array([text.PLUS]), digits(b),
                              jnp.array([text.EQUALS])])
    width = self.answer_len - 1
    return {
        "prompt": prompt.astype(jnp.int32),
        "answer": base.number_tokens((a + b) % self.modulus, width),
        # The systematic mistake: the receiver's own number, as if the message were ignored.
        "mistake": base.number_tokens(b % self.modulus, width),
    }

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    del key
    return problem["mistake"]
