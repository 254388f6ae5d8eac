"""The referential (Lewis signalling) game: a sender sees an object of `num_attributes` attributes, each
one of `num_values` values, and writes a message; a receiver reads only the message and writes the
object back.  No symbol means anything before training and no demonstration says what to write
(`demonstrated` is False: experiments train it from scratch), so the code a team ends up with is its
own convention, measured by `codes` (`message_metrics`).

The object is the prompt's segment `part_a` (`<bos>` then one digit per attribute), which `exchange`
shows the sender only; the answer is the object's digits then EOS.  Reward (`reward`): `attributes`,
the fraction of attributes written right (the default: a signal from the first step), or `exact`, 1
when every one is.
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from marl_jax import checks, codes, text
from marl_jax.tasks import base

REWARDS = ("attributes", "exact")


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: the base's demo_error_rate comes first
class Signalling(base.Task):
  name: ClassVar[str] = "signalling"
  demonstrated: ClassVar[bool] = False
  num_attributes: int = 2
  num_values: int = 4  # attribute values 0..num_values-1, one digit each
  reward: str = "attributes"
  # The sender's alphabet: the first `vocab` letters, which mean nothing before training (no EOS, so
  # every message fills the protocol's message_len), as Lewis games give a small vocabulary; 0: every
  # symbol the policy may write.
  vocab: int = 4

  def __post_init__(self):
    checks.integer("task.num_attributes", self.num_attributes, 1)
    checks.integer("task.num_values", self.num_values, 2, 10, note="one digit per value")
    checks.integer("task.vocab", self.vocab, 0, len(text.LETTERS), note="letters; 0: every writable symbol")
    if self.reward not in REWARDS:
      raise ValueError(f"config.task.reward={self.reward!r} is unknown; allowed: {list(REWARDS)}")

  @property
  def prompt_segments(self) -> tuple[tuple[str, int], ...]:
    return (("header", 1), ("part_a", self.num_attributes))

  @property
  def prompt_len(self) -> int:
    return 1 + self.num_attributes

  @property
  def answer_len(self) -> int:
    return self.num_attributes + 1

  @property
  def message_vocab(self) -> tuple[int, ...]:
    return tuple(text.TOKEN_ID[c] for c in text.LETTERS[:self.vocab])

  def sample(self, key) -> dict:
    object_K = jax.random.randint(key, (self.num_attributes,), 0, self.num_values)
    digits_K = text.DIGIT0 + object_K
    return {"prompt": jnp.concatenate([jnp.array([text.BOS]), digits_K]).astype(jnp.int32),
            "answer": jnp.concatenate([digits_K, jnp.array([text.EOS])]).astype(jnp.int32),
            "object": object_K.astype(jnp.int32)}

  def score(self, problem: dict, message_A) -> jax.Array:
    right_K = message_A[:self.num_attributes] == problem["answer"][:self.num_attributes]
    return (right_K.mean() if self.reward == "attributes" else right_K.all()).astype(jnp.float32)

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    """The first attribute's next value: the contract's systematic mistake (experiments do not
    warm-start this game on demonstrations)."""
    del key
    first = text.DIGIT0 + (problem["object"][0] + 1) % self.num_values
    return problem["answer"].at[0].set(first)

  def message_metrics(self, problems: dict, message_BxL) -> dict:
    return {"topsim": codes.topographic_similarity(problems["object"], message_BxL),
            "mutual_information": codes.mutual_information(problems["object"], message_BxL)}
