"""Multi-step arithmetic: `a op b op c ...=`, evaluated left to right modulo `modulus`."""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.tasks import base

OPS = "+-*"


@base.register
@dataclasses.dataclass(frozen=True)
class Arithmetic(base.Task):
  name: ClassVar[str] = "arithmetic"
  num_ops: int = 2  # operations in the chain
  max_operand: int = 9  # operands are drawn from 0..max_operand
  modulus: int = 10  # every intermediate result is taken mod this
  ops: str = OPS  # the operations drawn from, a subset of "+-*"
  demo_error_rate: float = 0.6

  def __post_init__(self):
    checks.integer("task.num_ops", self.num_ops, 1)
    checks.integer("task.max_operand", self.max_operand, 1)
    checks.integer("task.modulus", self.modulus, 2)
    if not self.ops or set(self.ops) - set(OPS):
      raise ValueError(f"config.task.ops={self.ops!r}; allowed: a non-empty subset of {OPS!r}")

  @property
  def operand_width(self) -> int:
    return len(str(self.max_operand))

  @property
  def prompt_len(self) -> int:
    return 2 + (self.num_ops + 1) * self.operand_width + self.num_ops  # BOS ... '='

  @property
  def answer_len(self) -> int:
    return len(str(self.modulus - 1)) + 1

  def evaluate(self, operands_N, ops_M):
    """Left-to-right value of the chain; also the value with the last operation dropped."""
    def apply(acc, x):
      b, op = x
      acc = jnp.select([op == 0, op == 1], [acc + b, acc - b], acc * b) % self.modulus  # op: index in OPS
      return acc, acc
    value, partials = jax.lax.scan(apply, operands_N[0] % self.modulus, (operands_N[1:], ops_M))
    before_last = operands_N[0] % self.modulus if self.num_ops == 1 else partials[-2]
    return value, before_last

  def chain(self, key):
    """One chain without BOS and '=': its tokens, value, and value with the last operation dropped."""
    k_operands, k_ops = jax.random.split(key)
    operands_N = jax.random.randint(k_operands, (self.num_ops + 1,), 0, self.max_operand + 1)
    allowed = jnp.asarray([OPS.index(o) for o in self.ops])
    ops_M = allowed[jax.random.randint(k_ops, (self.num_ops,), 0, len(self.ops))]
    value, before_last = self.evaluate(operands_N, ops_M)
    width = self.operand_width
    numbers = [base.fixed_width_tokens(operands_N[i], width) for i in range(self.num_ops + 1)]
    op_tokens = jnp.asarray([text.TOKEN_ID[o] for o in OPS])[ops_M]
    pieces = [numbers[0]]
    for i in range(self.num_ops):
      pieces += [op_tokens[i:i + 1], numbers[i + 1]]
    return jnp.concatenate(pieces).astype(jnp.int32), value, before_last

  def sample(self, key) -> dict:
    tokens_L, value, before_last = self.chain(key)
    answer_width = self.answer_len - 1
    return {
        "prompt": jnp.concatenate([jnp.array([text.BOS]), tokens_L, jnp.array([text.EQUALS])]
                                  ).astype(jnp.int32),
        "answer": base.number_tokens(value, answer_width),
        "mistake": base.number_tokens(before_last, answer_width),
    }

  def wrong_answer(self, problem, key):
    del key  # the mistake is systematic: forgetting the last operation
    return problem["mistake"]
