"""Several independent arithmetic chains, `c0,c1,c2=`; the answer is the sum of their values mod `modulus`.

Decomposable (`parts` = the chain segments): each chain is a sub-problem a worker can solve in parallel
(protocol `orchestrator`), while one agent must carry every chain in its head within a single short
answer.
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, text
from marl_jax.tasks import base
from marl_jax.tasks.arithmetic import OPS, Arithmetic


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: the base's demo_error_rate comes first
class MultiChain(base.Task):
  name: ClassVar[str] = "multi_chain"
  # Two one-operation chains at CPU scale: a 2-layer model learns to add two reports mod 10 but not
  # three (measured: the orchestrator's aggregation stays at chance with three chains).
  num_chains: int = 2
  num_ops: int = 1  # operations in each chain
  max_operand: int = 9
  modulus: int = 10
  demo_error_rate: float = 0.6

  def __post_init__(self):
    checks.integer("task.num_chains", self.num_chains, 1)
    _ = self.chain  # Arithmetic checks the chain knobs

  @property
  def chain(self) -> Arithmetic:
    return Arithmetic(num_ops=self.num_ops, max_operand=self.max_operand, modulus=self.modulus)

  @property
  def prompt_segments(self) -> tuple[tuple[str, int], ...]:
    chain_len = self.chain.prompt_len - 1  # a chain and its ',' (or the final '=')
    return (("header", 1),) + tuple((f"chain{i}", chain_len) for i in range(self.num_chains))

  @property
  def prompt_len(self) -> int:
    return sum(n for _, n in self.prompt_segments)

  @property
  def answer_len(self) -> int:
    return self.chain.answer_len

  @property
  def parts(self) -> tuple[str, ...]:
    return tuple(f"chain{i}" for i in range(self.num_chains))

  @property
  def part_answer_len(self) -> int:
    return self.chain.answer_len

  def combine(self, values_C):
    return values_C.sum() % self.modulus

  def part_value(self, message_L):
    """A sub-problem written as a message (one chain as in the prompt, then EOS): (value, ok); ok is
    False unless the message is exactly that (operands, operations, EOS; PAD after)."""
    chain, w = self.chain, self.chain.operand_width
    L = (chain.num_ops + 1) * w + chain.num_ops  # the chain's tokens
    op_pos = np.arange(L) % (w + 1) == w
    digit_L = message_L[:L] - text.DIGIT0
    op_match_LxO = message_L[:L, None] == jnp.asarray([text.TOKEN_ID[o] for o in OPS])
    ok = (jnp.all(jnp.where(op_pos, op_match_LxO.any(-1), (digit_L >= 0) & (digit_L <= 9)))
          & (message_L[L] == text.EOS) & jnp.all(message_L[L + 1:] == text.PAD))
    operands_N = digit_L[~op_pos].reshape(-1, w) @ 10 ** jnp.arange(w - 1, -1, -1)
    value, _ = chain.evaluate(operands_N, jnp.argmax(op_match_LxO[op_pos], -1))
    return value, ok

  def mistaken_values(self, values_C, mistakes_C):
    """The parts' values behind the systematic mistake: the last chain's result lost (0 adds nothing),
    as when a worker's report is dropped."""
    del mistakes_C
    return values_C.at[-1].set(0)

  def sample(self, key) -> dict:
    tokens_CxL, values_C, mistakes_C = jax.vmap(self.chain.chain)(jax.random.split(key, self.num_chains))
    separators_C = jnp.full((self.num_chains, 1), text.TOKEN_ID[","]).at[-1].set(text.EQUALS)
    prompt = jnp.concatenate([jnp.array([text.BOS]), jnp.concatenate([tokens_CxL, separators_C], 1).ravel()])
    return {
        "prompt": prompt.astype(jnp.int32),
        "answer": self.answer_of_parts(values_C),
        "mistake": self.answer_of_parts(self.mistaken_values(values_C, mistakes_C)),
        "part_values": values_C.astype(jnp.int32),
        # A worker's systematic mistake: its chain's last operation dropped (as in `arithmetic`).
        "part_mistakes": mistakes_C.astype(jnp.int32),
    }

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    del key
    return problem["mistake"]
