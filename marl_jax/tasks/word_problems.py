"""Word problems in free text, for a language-model agent (`config.model.checkpoint`).

Questions and answers come from a local jsonl file or TFDS directory (`word_problem_sets.load`); each
question is posed as the user turn of the checkpoint's chat layout, left-padded to `max_prompt_len`
tokens, and the agent answers in free text over its whole vocabulary (`lm.agent.canvas_ids`) within
`answer_len` tokens.  The reward is 1 when the final answer read from the message (GSM8K's
conventions, `word_problem_sets.extract_final_answer`) equals the reference: the message is decoded
with the tokenizer and scored on the host (`jax.pure_callback`) by the same function the tests check,
not by a second parser written in JAX.  Demonstrations are the answer fields as written (a worked
solution, or the number); a wrong one is the same text with its final answer one too high.

The canvas holds canvas values (`lm.agent.canvas_ids`), not the engine's symbol strings, so a problem
is only readable through the tokenizer (`render`).
"""
import dataclasses
import functools
import hashlib
import os
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, text, word_problem_sets
from marl_jax.lm import agent as lm_agent
from marl_jax.tasks import base


class _Data(NamedTuple):
  """A task's problems as canvas values: the training rows, then the evaluation rows."""
  prompt_NxP: np.ndarray
  solution_NxA: np.ndarray  # the demonstration: the answer field as written, EOS, PAD
  wrong_NxA: np.ndarray  # the same with its final answer one too high
  reference_N: tuple[str, ...]  # final answers (canonical numbers)
  num_train: int
  canvas_ids_W: np.ndarray  # tokenizer id of each canvas value
  value_of_id: np.ndarray  # the canvas value of each tokenizer id (the end of turn's: EOS)
  tokenizer: object  # lm.tokenizer.Tokenizer

  def decode(self, canvas_values, message: bool = True) -> str:
    """The text of canvas values (padding left out); a `message` ends at its first EOS."""
    values = np.asarray(canvas_values).reshape(-1)
    if message and (values == text.EOS).any():
      values = values[:np.argmax(values == text.EOS)]
    return lm_agent.decode(self.tokenizer, self.canvas_ids_W, values)


@base.register
@dataclasses.dataclass(frozen=True)
class WordProblems(base.Task):
  name: ClassVar[str] = "word_problems"
  free_text: ClassVar[bool] = True  # needs a language-model agent over its whole vocabulary

  path: str = ""  # training questions: a jsonl file or a TFDS version directory
  eval_path: str = ""  # evaluation questions (default: `path`, its `eval_split` for a TFDS directory)
  split: str = "train"  # TFDS splits
  eval_split: str = "test"
  question_key: str = "question"
  answer_key: str = "answer"
  answer_style: str = "auto"  # gsm8k (a worked solution ending '#### N'), plain (the number) or auto
  max_prompt_len: int = 128
  max_answer_len: int = 64  # tokens of a message, its end-of-turn token included
  drop_long: bool = False  # leave out problems whose prompt or demonstration does not fit, not refuse
  # The name each protocol role speaks as in the chat layout (role:name, comma-separated, roles of the
  # workflow); any other role speaks as its own name (experiments/lm_word_problems.py makes a single
  # agent the model's assistant).
  chat_roles: str = ""
  tokenizer: str = ""  # the checkpoint directory whose tokenizer poses the problems (set by the run)

  @property
  def prompt_len(self) -> int:
    return self.max_prompt_len

  @property
  def answer_len(self) -> int:
    return self.max_answer_len

  def check(self, eval_size: int) -> None:
    """Reads and encodes every problem now, so a bad file fails before anything compiles."""
    data = self._data()
    available = len(data.reference_N) - data.num_train
    if eval_size > available:
      raise ValueError(f"config.eval.size={eval_size} is more than the {available} evaluation questions "
                       f"of config.task.eval_path (or path); allowed: at most {available}")

  @functools.lru_cache(maxsize=4)
  def _data(self) -> _Data:
    if not self.path:
      raise ValueError("config.task.path is empty; allowed: a jsonl file of question/answer pairs or a "
                       "TFDS directory in array_record format")
    if not self.tokenizer:
      raise ValueError("config.task.name='word_problems' needs a language-model agent: set "
                       "config.model.checkpoint to a local Qwen3/Llama checkpoint directory")
    checks.integer("task.max_prompt_len", self.max_prompt_len, 1)
    checks.integer("task.max_answer_len", self.max_answer_len, 2)
    if self.answer_style not in word_problem_sets.ANSWER_STYLES:
      raise ValueError(f"config.task.answer_style={self.answer_style!r}; allowed: "
                       f"{list(word_problem_sets.ANSWER_STYLES)}")
    tok, canvas_ids_W = lm_agent.free_text_canvas(self.tokenizer)
    value_of_id = np.full(max(tok.vocab_size, int(canvas_ids_W.max()) + 1), -1)
    value_of_id[canvas_ids_W] = np.arange(len(canvas_ids_W))
    value_of_id[tok.end_of_turn_id] = text.EOS
    # Text a problem may hold: a special token in a question or solution would read as the chat
    # layout's (a turn opened or closed mid-text), and a token past the model's vocabulary has no value.
    plain_id = value_of_id >= 0
    plain_id[[i for i, added in tok.tok.get_added_tokens_decoder().items() if added.special]] = False

    def read(key, path, split):
      try:
        return word_problem_sets.load(path, answer_style=self.answer_style, question_key=self.question_key,
                                  answer_key=self.answer_key, split=split)
      except (OSError, ValueError) as e:
        raise ValueError(f"config.task.{key}={path!r}: {e}") from e

    def encode(problems, key):
      """Canvas rows of the problems that fit (all of them unless drop_long)."""
      solution_ids = [tok.encode(s) for s in problems.solutions]
      for i, (question, solution) in enumerate(zip(problems.questions, solution_ids)):
        for field, ids in (("question", tok.encode(question)), ("answer", solution)):
          unusable = [t for t in ids if not plain_id[t]]
          if unusable:
            raise ValueError(f"config.task.{key}: problem {i}'s {field} holds {tok.decode(unusable[:1])!r}, "
                             "a special token of the tokenizer or one past the model's vocabulary; allowed: "
                             "text without them")
      try:
        prompts = word_problem_sets.encode_prompts(tok, problems.questions, self.max_prompt_len,
                                               drop_long=True, next_role=None)
      except ValueError as e:  # not one question fits
        raise ValueError(f"config.task.{key}: {e}; raise config.task.max_prompt_len") from e
      solutions = [ids + [tok.end_of_turn_id] for ids in solution_ids]
      # A wrong demonstration (Task.demonstrate, at demo_error_rate > 0) may be a token longer than the
      # right one (99 -> 100): it must fit only when demonstrations use it, and is the right one if not.
      wrongs = [tok.encode(word_problem_sets.wrong_solution(s)) + [tok.end_of_turn_id]
                for s in problems.solutions] if self.demo_error_rate else solutions
      fits = {int(i) for i in prompts.index_N} & {
          i for i, (s, w) in enumerate(zip(solutions, wrongs)) if max(len(s), len(w)) <= self.answer_len}
      if len(fits) < len(problems.questions) and not self.drop_long:
        longest = {"right": max(map(len, solutions)), "wrong": max(map(len, wrongs))}
        which = max(longest, key=longest.get)  # the right one on a tie
        raise ValueError(f"config.task.{key}: {len(problems.questions) - len(fits)} of "
                         f"{len(problems.questions)} problems do not fit config.task.max_prompt_len="
                         f"{self.max_prompt_len} (prompt) or max_answer_len={self.answer_len} (the "
                         f"longest {which} demonstration is {longest[which]} tokens); raise them or set "
                         f"config.task.drop_long=True")
      if not fits:
        raise ValueError(f"config.task.{key}: no problem fits config.task.max_prompt_len="
                         f"{self.max_prompt_len} and max_answer_len={self.answer_len}")
      rows = [r for r, i in enumerate(prompts.index_N) if int(i) in fits]
      index = [int(prompts.index_N[r]) for r in rows]
      prompt_NxP = np.where(np.arange(self.max_prompt_len) >= self.max_prompt_len
                            - prompts.prompt_len_N[rows, None], value_of_id[prompts.prompt_NxP[rows]],
                            text.PAD)

      def messages(ids_list):
        out = np.full((len(index), self.answer_len), text.PAD)
        for row, i in enumerate(index):
          out[row, :len(ids_list[i])] = value_of_id[ids_list[i]]
        return out
      return (prompt_NxP, messages(solutions), messages(wrongs),
              tuple(problems.answers[i] for i in index))

    train = encode(read("path", self.path, self.split), "path")
    # A jsonl file has no splits: without eval_path the evaluation questions are the training file's.
    evals = encode(read("eval_path", self.eval_path or self.path, self.eval_split), "eval_path")
    joined = [np.concatenate([a, b]).astype(np.int32) for a, b in zip(train[:3], evals[:3])]
    return _Data(*joined, train[3] + evals[3], len(train[3]), canvas_ids_W, value_of_id, tok)

  def problem_knobs(self) -> dict:
    """The evaluation file's name and a digest of what the run reads from it (the encoded prompts,
    demonstrations and answers, and the tokenizer's table), not the paths: a name must stay short, and
    an edited file or another tokenizer is another set."""
    data = self._data()
    evals = slice(data.num_train, None)
    digest = hashlib.sha256()
    for array in (data.prompt_NxP[evals], data.solution_NxA[evals], data.canvas_ids_W):
      digest.update(np.ascontiguousarray(array).tobytes())
    digest.update("\n".join(data.reference_N[evals]).encode())
    return {"source": os.path.basename(os.path.normpath(self.eval_path or self.path)),
            "digest": digest.hexdigest()[:16]}

  def _problem(self, i):
    data = self._data()
    return {"prompt": jnp.asarray(data.prompt_NxP)[i], "answer": jnp.asarray(data.solution_NxA)[i],
            "wrong": jnp.asarray(data.wrong_NxA)[i], "index": jnp.asarray(i, jnp.int32)}

  def sample(self, key) -> dict:
    return self._problem(jax.random.randint(key, (), 0, self._data().num_train))

  def eval_set(self, seed: int, n: int) -> dict:
    """The first `n` evaluation questions, in order (the seed does not apply: the set is a file's)."""
    del seed
    self.check(n)
    return jax.vmap(self._problem)(self._data().num_train + jnp.arange(n))

  def _on_host(self, per_message, out: jax.ShapeDtypeStruct, message_A, *row_args):
    """`per_message(data, text, *row_values)` of each message as the tokenizer decodes it, on the host
    (`jax.pure_callback`, broadcast under vmap): an `out`-shaped value per message."""
    def host(message, *args):
      data = self._data()
      message = np.asarray(message)
      rows = message.shape[:-1]
      args = [np.asarray(a) for a in args]
      result = np.zeros(rows + out.shape, out.dtype)
      for pos in np.ndindex(rows):
        result[pos] = per_message(data, data.decode(message[pos]), *(a[pos] for a in args))
      return result

    return jax.pure_callback(host, out, message_A, *row_args, vmap_method="broadcast_all")

  def score(self, problem: dict, message_A) -> jax.Array:
    """1.0 when the message's final answer is the reference's, on the host (see the module's doc)."""
    return self._on_host(lambda data, said, index: word_problem_sets.score(said, data.reference_N[int(index)]),
                         jax.ShapeDtypeStruct((), jnp.float32), message_A, problem["index"])

  def turn_headers(self, turn_roles: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """Each turn opens as the chat layout opens a turn of the role's chat name (`chat_roles`):
    ChatML's `<|im_start|>solver\\n`, Llama-3's `<|start_header_id|>solver<|end_header_id|>\\n\\n`, after the
    first turn preceded by the layout's text between turns; the policy's end-of-turn token closes it."""
    data = self._data()
    roles = list(dict.fromkeys(turn_roles))
    pairs = [pair.split(":", 1) for pair in self.chat_roles.split(",") if pair]
    if any(len(pair) != 2 or pair[0] not in roles or not pair[1] for pair in pairs):
      raise ValueError(f"config.task.chat_roles={self.chat_roles!r}; allowed: comma-separated role:name "
                       f"pairs, each role one of this workflow's {roles}")
    names = dict(pairs)
    layout = data.tokenizer.layout
    opening = lambda i, role: (layout.after_turn if i else "") + layout.header.format(role=names.get(role, role))
    return tuple(tuple(int(v) for v in data.value_of_id[data.tokenizer.encode(opening(i, role))])
                 for i, role in enumerate(turn_roles))

  def vote_key(self, message_A) -> jax.Array:
    """Votes compare final answers: key_2 is a 64-bit digest of the message's final answer (of its
    whole text when it gives none, so only identical such messages agree), on the host."""

    def digest(data, said):
      del data
      final = word_problem_sets.extract_final_answer(said)
      said_key = f"answer:{final}" if final is not None else f"text:{said}"
      return np.frombuffer(hashlib.blake2b(said_key.encode(), digest_size=8).digest(), np.int32)

    return self._on_host(digest, jax.ShapeDtypeStruct((2,), jnp.int32), message_A)

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    del key
    return problem["wrong"]

  def render(self, problem: dict) -> str:
    data = self._data()
    return f"{data.decode(problem['prompt'], message=False)} {data.decode(problem['answer'])}"
