"""What every task provides.  Tasks are frozen dataclasses (static, hashable: closed over by jit).

A problem is a dict of arrays for ONE instance; callers vmap `sample` (or call `sample_batch`), `score`
and `demonstrate`.  Every problem holds at least `prompt` (int32[prompt_len], starting with BOS, PAD-padded) and
`answer` (int32[answer_len], the target message: tokens, EOS, PAD...), which scores 1.
`tests/contract_test.py` checks this contract on every registered task.
"""
import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp

from marl_jax import checks, registry, text

REGISTRY = registry.Registry("task.name", "task")


def register(cls):
  """Registers a task class under its `name` (`config.task.name`)."""
  return REGISTRY.register(cls.name)(cls)


@dataclasses.dataclass(frozen=True)
class Task:
  name: ClassVar[str] = ""  # the registry name (`config.task.name`); set by each registered task
  # Free text (word problems): the agent writes over a language model's whole vocabulary, not symbols.
  free_text: ClassVar[bool] = False
  # Whether experiments warm-start it on demonstrations; False for a game whose code is the team's own
  # convention (signalling), trained from scratch (`config.sft.steps=0`).
  demonstrated: ClassVar[bool] = True
  # Fraction of warm-start demonstrations that carry a plausible wrong answer: the knob that keeps the
  # base model weak, as a small pretrained model is, so RL has room to show gains.
  demo_error_rate: float = 0.0

  @property
  def prompt_len(self) -> int:
    raise NotImplementedError

  @property
  def answer_len(self) -> int:
    raise NotImplementedError

  @property
  def prompt_segments(self) -> tuple[tuple[str, int], ...]:
    """Named prompt parts, in canvas order; a protocol's visibility table can hide some from roles."""
    return (("problem", self.prompt_len),)

  def sample(self, key) -> dict:
    raise NotImplementedError

  def sample_batch(self, key_B) -> dict:
    """A problem per key (B keys: a dict of B-row arrays), one program per task (equal tasks share it)."""
    return _sample_batch(self, key_B)

  def check(self, eval_size: int) -> None:
    """Reads whatever the task needs from disk now, so a bad file fails before anything compiles, and
    checks that its evaluation set can hold `eval_size` problems."""

  def problem_knobs(self) -> dict:
    """The knobs that define the problems, which name a saved evaluation set (`datasets`): every
    field but the demonstrations' noise."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "demo_error_rate"}

  def eval_set(self, seed: int, n: int) -> dict:
    """The fixed evaluation set: `n` problems drawn with the seed (a file's task: its own questions)."""
    return self.sample_batch(jax.random.split(jax.random.PRNGKey(seed), n))

  def score(self, problem: dict, message_A) -> jax.Array:
    """Reward in [0, 1] for a final-answer message; default: exact match of the answer tokens."""
    return jnp.all(canonical(message_A) == problem["answer"]).astype(jnp.float32)

  def turn_headers(self, turn_roles: tuple[str, ...]) -> tuple[tuple[int, ...], ...] | None:
    """The canvas tokens the environment writes before each turn's message (turn i by role
    `turn_roles[i]`), or None for the engine's own header, the role's marker token.  A task posed in
    a chat layout returns the layout's turn openings (word problems)."""
    del turn_roles
    return None

  def vote_key(self, message_A) -> jax.Array:
    """What makes two final-answer messages the same vote (`protocols.vote.majority`): equal keys,
    key_K.  Default: the message's tokens up to its first EOS."""
    return canonical(message_A)

  @property
  def message_vocab(self) -> tuple[int, ...]:
    """The tokens a sender may write in its message (`exchange`), () for any the policy may write:
    signalling's small alphabet."""
    return ()

  def message_metrics(self, problems: dict, message_BxL) -> dict:
    """Scalars that describe the code of a sender's messages (message_BxL) for a batch of problems,
    logged with the workflow's metrics by `exchange`: none by default (signalling's `codes`)."""
    del problems, message_BxL
    return {}

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    """A plausible mistake for demonstrations (a systematic one, so greedy decoding can pick it)."""
    raise NotImplementedError

  def demonstrate(self, problem: dict, key) -> jax.Array:
    k_err, k_wrong = jax.random.split(key)
    wrong = jax.random.bernoulli(k_err, self.demo_error_rate)
    return jnp.where(wrong, self.wrong_answer(problem, k_wrong), problem["answer"])

  @property
  def parts(self) -> tuple[str, ...]:
    """A decomposable task's independent sub-problems, as prompt segment names; () otherwise.

    A decomposable task also has `part_answer_len`, `combine(values_C)` (the answer's value from the
    parts' values; a 0 adds nothing, so a subset of parts combines with the rest set to 0), or instead
    its own `answer_of_parts` (wide's list of the parts' values), and
    problems with `part_values` and `part_mistakes` (int[C]); part answers and the answer are written
    as decimal numbers (`number_tokens`).  A part's prompt segment is its sub-problem then one
    separator token; `part_value(message_L) -> (value, ok)` reads a sub-problem written as a message
    (those tokens, then EOS), e.g. an orchestrator's assignment to a worker.
    """
    return ()

  def answer_of_parts(self, values_C) -> jax.Array:
    """A decomposable task's answer message from its parts' values (in part order): by default
    `combine`'s value as a number."""
    return number_tokens(self.combine(values_C), self.answer_len - 1)

  def render(self, problem: dict) -> str:
    return f"{text.decode(problem['prompt'])} {text.decode(problem['answer'])}"


@functools.partial(jax.jit, static_argnums=0)
def _sample_batch(task: Task, key_B) -> dict:
  return jax.vmap(task.sample)(key_B)


def canonical(message_A):
  """Everything after the first EOS becomes PAD, so messages compare token by token."""
  is_eos = message_A == text.EOS
  after_eos = jnp.cumsum(is_eos) - is_eos > 0
  return jnp.where(after_eos, text.PAD, message_A)


def number_tokens(x, width: int):
  """Decimal digits of non-negative int `x` (no leading zeros), EOS, then PAD: int32[width + 1]."""
  n_digits = 1 + sum((x >= 10**i).astype(jnp.int32) for i in range(1, width))
  j = jnp.arange(width + 1)
  power = 10 ** jnp.clip(n_digits - 1 - j, 0, width - 1)
  digit = text.DIGIT0 + (x // power) % 10
  return jnp.where(j < n_digits, digit, jnp.where(j == n_digits, text.EOS, text.PAD)).astype(jnp.int32)


def parse_number(message_A):
  """The decimal number a message writes (digits, then EOS): (value, ok); ok is False otherwise."""
  j = jnp.arange(message_A.shape[-1])
  is_eos = message_A == text.EOS
  n = jnp.argmax(is_eos)  # the first EOS
  digit = message_A - text.DIGIT0
  ok = is_eos.any() & (n >= 1) & jnp.all(((digit >= 0) & (digit <= 9)) | (j >= n))
  value = jnp.sum(jnp.where(j < n, digit * 10 ** jnp.clip(n - 1 - j, 0), 0))
  return value, ok


def fixed_width_tokens(x, width: int):
  """Zero-padded decimal digits of `x`, exactly `width` tokens (prompts keep a fixed layout)."""
  power = 10 ** (width - 1 - jnp.arange(width))
  return (text.DIGIT0 + (x // power) % 10).astype(jnp.int32)


def eval_problems(task: Task, seed: int, n: int) -> dict:
  """The fixed evaluation set: the same `n` problems for a given task, seed and difficulty."""
  return task.eval_set(seed, n)


def check_rates(group: str, settings: dict) -> None:
  """Refuses a knob named `*_rate` (every one a probability: a demonstration's error rate, how often
  a demonstration delegates) outside [0, 1]; written as what is allowed, so a NaN is refused too."""
  for key, value in settings.items():
    if key.endswith("_rate"):
      checks.probability(f"{group}.{key}", value)
