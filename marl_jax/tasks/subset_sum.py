"""Subset sum: `n,n,...,n=target`; the answer marks ('1'/'0' per number) a subset summing to the target.

Easier to check than to solve: checking is one sum, finding is a search, so a verifier pays off.  Any
valid subset scores; the problem's `answer` is the subset the target was built from (one always exists).
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.tasks import base

ONE, ZERO = text.TOKEN_ID["1"], text.TOKEN_ID["0"]


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: the base's demo_error_rate comes first
class SubsetSum(base.Task):
  name: ClassVar[str] = "subset_sum"
  num_numbers: int = 5
  max_number: int = 9  # numbers are drawn from 1..max_number
  demo_error_rate: float = 0.3

  def __post_init__(self):
    checks.integer("task.num_numbers", self.num_numbers, 1)
    checks.integer("task.max_number", self.max_number, 1)

  @property
  def number_width(self) -> int:
    return len(str(self.max_number))

  @property
  def target_width(self) -> int:
    return len(str(self.num_numbers * self.max_number))

  @property
  def prompt_len(self) -> int:
    return 1 + self.num_numbers * (self.number_width + 1) + self.target_width  # BOS n,..,n=target

  @property
  def answer_len(self) -> int:
    return self.num_numbers + 1

  def sample(self, key) -> dict:
    k_numbers, k_mask, k_one = jax.random.split(key, 3)
    N = self.num_numbers
    numbers_N = jax.random.randint(k_numbers, (N,), 1, self.max_number + 1)
    mask_N = jax.random.bernoulli(k_mask, 0.5, (N,))
    # An empty subset would make the target 0; pick one number instead.
    mask_N = mask_N | (~mask_N.any() & (jnp.arange(N) == jax.random.randint(k_one, (), 0, N)))
    target = jnp.sum(numbers_N * mask_N)
    separators_N = jnp.full((N, 1), text.TOKEN_ID[","]).at[-1].set(text.EQUALS)
    numbers_NxW = jax.vmap(lambda x: base.fixed_width_tokens(x, self.number_width))(numbers_N)
    prompt = jnp.concatenate([jnp.array([text.BOS]), jnp.concatenate([numbers_NxW, separators_N], 1).ravel(),
                              base.fixed_width_tokens(target, self.target_width)])
    # The systematic mistake: the last chosen number left out.
    last = N - 1 - jnp.argmax(mask_N[::-1])
    return {
        "prompt": prompt.astype(jnp.int32),
        "answer": self.mask_tokens(mask_N),
        "mistake": self.mask_tokens(mask_N.at[last].set(False)),
        "numbers": numbers_N.astype(jnp.int32),
        "target": target.astype(jnp.int32),
    }

  def mask_tokens(self, mask_N):
    return jnp.append(jnp.where(mask_N, ONE, ZERO), text.EOS).astype(jnp.int32)

  def score(self, problem: dict, message_A) -> jax.Array:
    message_A = base.canonical(message_A)
    bits_N = message_A[:self.num_numbers]
    well_formed = jnp.all((bits_N == ONE) | (bits_N == ZERO)) & (message_A[-1] == text.EOS)
    total = jnp.sum(problem["numbers"] * (bits_N == ONE))
    return (well_formed & (total == problem["target"])).astype(jnp.float32)

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    del key
    return problem["mistake"]
