"""Program synthesis in a tiny stack language: from input->output examples, write the program.

Prompt: `i:o,i:o,...,i:o=` (a few examples).  Answer: a program, one token per instruction, then EOS::

  x       push the input          0-9   push the digit          d   duplicate the top
  s       swap the top two        + - * pop b, pop a, push a op b (everything mod `modulus`)

The program's output is the top of the stack.  `score` runs the written program with `run` (a JAX
interpreter: `lax.scan` over the tokens, a fixed-size stack) on every input 0..modulus-1, the examples
and the hidden rest, and pays 1 only when all outputs are right: any program computing the function
counts, not just the one the problem was generated from.
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.tasks import base

INPUT, DUP, SWAP = (text.TOKEN_ID[c] for c in "xds")
OPS = (text.PLUS, text.MINUS, text.TIMES)


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: the base's demo_error_rate comes first
class StackProgram(base.Task):
  name: ClassVar[str] = "stack_program"
  num_ops: int = 2  # binary operations in the generated program (its length is 2 * num_ops + 1)
  num_examples: int = 4  # input->output pairs shown in the prompt
  modulus: int = 10  # inputs are 0..modulus-1; every value is taken mod modulus
  demo_error_rate: float = 0.4

  def __post_init__(self):
    checks.integer("task.num_ops", self.num_ops, 1)
    checks.integer("task.modulus", self.modulus, 2)
    checks.integer("task.num_examples", self.num_examples, 1, self.modulus,
                   note="distinct inputs below config.task.modulus")

  @property
  def width(self) -> int:
    return len(str(self.modulus - 1))

  @property
  def prompt_len(self) -> int:
    return 1 + self.num_examples * (2 * self.width + 2)

  @property
  def answer_len(self) -> int:
    return 2 * self.num_ops + 2

  def random_program(self, key):
    """A random valid postfix program: num_ops + 1 pushes (the first reads the input), num_ops ops."""
    def step(carry, t_k):
      depth, pushes_left, ops_left = carry
      t, k = t_k
      k_coin, k_leaf, k_const, k_op = jax.random.split(k, 4)
      # An operation needs two operands; once the pushes are spent only operations remain.
      is_op = (depth >= 2) & (ops_left > 0) & ((pushes_left == 0) | jax.random.bernoulli(k_coin))
      const = text.DIGIT0 + jax.random.randint(k_const, (), 0, min(10, self.modulus))
      leaf = jnp.stack([INPUT, DUP, const])[jax.random.randint(k_leaf, (), 0, 3)]
      leaf = jnp.where(t == 0, INPUT, leaf)
      token = jnp.where(is_op, jnp.asarray(OPS)[jax.random.randint(k_op, (), 0, len(OPS))], leaf)
      return (depth + jnp.where(is_op, -1, 1), pushes_left - ~is_op, ops_left - is_op), token

    length = 2 * self.num_ops + 1
    _, program_L = jax.lax.scan(step, (0, self.num_ops + 1, self.num_ops),
                                (jnp.arange(length), jax.random.split(key, length)))
    return program_L.astype(jnp.int32)

  def run(self, program_L, x):
    """Output of a program (tokens up to EOS or PAD) on input x, and whether it ran without error."""
    m = self.modulus
    stack_S = jnp.zeros(program_L.shape[0] + 1, jnp.int32)  # never overflows: one push per token

    def step(carry, token):
      stack_S, depth, ok, halted = carry
      halted = halted | (token == text.EOS) | (token == text.PAD)
      top, second = stack_S[jnp.maximum(depth - 1, 0)], stack_S[jnp.maximum(depth - 2, 0)]
      is_digit = (token >= text.DIGIT0) & (token < text.DIGIT0 + 10)
      is_push = is_digit | (token == INPUT) | (token == DUP)
      is_op = (token == OPS[0]) | (token == OPS[1]) | (token == OPS[2])
      is_swap = token == SWAP
      needs = jnp.where(is_op | is_swap, 2, jnp.where(token == DUP, 1, 0))
      ok = ok & (halted | ((is_push | is_op | is_swap) & (depth >= needs)))
      pushed = jnp.select([is_digit, token == INPUT], [(token - text.DIGIT0) % m, x], top)
      result = jnp.select([token == OPS[0], token == OPS[1]], [second + top, second - top], second * top) % m
      new_stack_S = jnp.where(is_push, stack_S.at[depth].set(pushed),
                              jnp.where(is_swap, stack_S.at[depth - 1].set(second).at[depth - 2].set(top),
                                        stack_S.at[depth - 2].set(result)))
      new_depth = depth + jnp.where(is_push, 1, jnp.where(is_swap, 0, -1))
      active = ok & ~halted
      return (jnp.where(active, new_stack_S, stack_S), jnp.where(active, new_depth, depth), ok, halted), None

    (stack_S, depth, ok, _), _ = jax.lax.scan(step, (stack_S, 0, True, False), program_L)
    return stack_S[jnp.maximum(depth - 1, 0)], ok & (depth >= 1)

  def outputs(self, program_L):
    """Outputs on every input 0..modulus-1 (-1 where the program fails): int32[modulus]."""
    value_M, ok_M = jax.vmap(self.run, in_axes=(None, 0))(program_L, jnp.arange(self.modulus))
    return jnp.where(ok_M, value_M, -1)

  def sample(self, key) -> dict:
    k_program, k_examples = jax.random.split(key)
    program_L = self.random_program(k_program)
    outputs_M = self.outputs(program_L)
    inputs_E = jax.random.permutation(k_examples, self.modulus)[:self.num_examples]
    digits = jax.vmap(lambda x: base.fixed_width_tokens(x, self.width))
    colon = jnp.full((self.num_examples, 1), text.TOKEN_ID[":"])
    separator = jnp.full((self.num_examples, 1), text.TOKEN_ID[","]).at[-1].set(text.EQUALS)
    examples = jnp.concatenate([digits(inputs_E), colon, digits(outputs_M[inputs_E]), separator], 1)
    # The systematic mistake: the last operation replaced by the next one in + - *.
    next_op = jnp.asarray(OPS)[(jnp.argmax(jnp.asarray(OPS) == program_L[-1]) + 1) % len(OPS)]
    return {
        "prompt": jnp.concatenate([jnp.array([text.BOS]), examples.ravel()]).astype(jnp.int32),
        "answer": jnp.append(program_L, text.EOS),
        "mistake": jnp.append(program_L.at[-1].set(next_op), text.EOS),
        "outputs": outputs_M.astype(jnp.int32),
    }

  def score(self, problem: dict, message_A) -> jax.Array:
    return jnp.all(self.outputs(base.canonical(message_A)) == problem["outputs"]).astype(jnp.float32)

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    del key
    return problem["mistake"]
