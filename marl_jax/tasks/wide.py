"""W independent short chains, `c0,c1,...=`; the answer is the list of their values, in order, each
written in the modulus's fixed width (`3,7,1=` -> `371<eos>` mod 10).

A task that grows with the team (protocol `delegate` with one worker per chain): the orchestrator's job
is to split and to collect, not to do W-way arithmetic, while one agent alone must write all W values.
Scored per part: the team outcome is the fraction of parts right, or with `all_right` 1 only when every
part is.
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.tasks import base
from marl_jax.tasks.multi_chain import MultiChain

MAX_PARTS = 64


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Wide(MultiChain):
  name: ClassVar[str] = "wide"
  num_chains: int = 4  # W, the parts
  all_right: bool = False  # score 1 only when every part is right (else the fraction right)
  demo_error_rate: float = 0.6

  def __post_init__(self):
    checks.integer("task.num_chains", self.num_chains, 2, MAX_PARTS)
    if not isinstance(self.all_right, bool):
      raise ValueError(f"config.task.all_right={self.all_right!r}; allowed: True or False")
    _ = self.chain

  @property
  def part_width(self) -> int:
    return self.part_answer_len - 1

  @property
  def answer_len(self) -> int:
    return self.num_chains * self.part_width + 1

  def answer_of_parts(self, values_C):
    """Each part's value in the fixed width, in part order, then EOS."""
    digits_CxW = jax.vmap(base.fixed_width_tokens, in_axes=(0, None))(values_C, self.part_width)
    return jnp.append(digits_CxW.ravel(), text.EOS).astype(jnp.int32)

  def part_scores(self, problem: dict, message_A):
    """right_C: whether each part's digits in the final answer are its value (after the first EOS,
    nothing is written, so a short answer misses the parts it did not reach)."""
    C, w = self.num_chains, self.part_width
    written_CxW = base.canonical(message_A)[:C * w].reshape(C, w)
    return jnp.all(written_CxW == problem["answer"][:C * w].reshape(C, w), -1)

  def score(self, problem: dict, message_A):
    right_C = self.part_scores(problem, message_A)
    return (right_C.all() if self.all_right else right_C.mean()).astype(jnp.float32)

  def mistaken_values(self, values_C, mistakes_C):
    """The last part's last operation dropped (its own systematic mistake)."""
    return values_C.at[-1].set(mistakes_C[-1])
