"""Word-problem sets for checkpoint agents: question/answer pairs from local files, exact scoring of final
answers (GSM8K conventions), and prompts encoded for a checkpoint's tokenizer.  (The word-problem task
is `tasks.word_problems`; procedural tasks' evaluation sets in words are `datasets.eval_set_in_words`.)

`load(path)` reads one of::

  jsonl  one JSON object a line, with a question field and an answer field (names configurable);
  tfds   a TFDS dataset directory in array_record format (e.g. what `tfds build gsm8k
         --file_format=array_record` writes), read with `tfds.builder_from_directory` and grain;

and takes the final answer from the answer field in one of two styles::

  gsm8k  a worked solution whose last line is `#### N`;
  plain  the number itself (a JSON string or number).
"""
import dataclasses
import decimal
import json
import os
import re
from typing import NamedTuple, Sequence

import numpy as np
import tensorflow_datasets as tfds

from marl_jax import array_records
from marl_jax.lm import tokenizer as lm_tokenizer

SOURCES = ("auto", "jsonl", "tfds")  # auto: a directory is tfds, a file jsonl
ANSWER_STYLES = ("auto", "gsm8k", "plain")  # auto: gsm8k when the first answer holds the mark
GSM8K_MARK = "####"
# A number as written in prose: an optional sign (`-` or the minus sign U+2212) and `$`, digits with or
# without thousands commas and an optional decimal part, or a decimal part alone (`.5`). A sign right
# after a letter, digit or `)` is an operator (`10-3`), not a sign; a `.` with no digit after it ends a
# sentence.
_NUMBER = re.compile(r"(?<![\w.)])[-\u2212]?\$?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)")


@dataclasses.dataclass(frozen=True)
class WordProblems:
  questions: tuple[str, ...]
  answers: tuple[str, ...]  # final answers as canonical numbers: "42", "-3", "2.25"
  source: str  # the file, directory or evaluation set they come from
  solutions: tuple[str, ...]  # the answer fields as written: a worked solution, or the number


class Prompts(NamedTuple):
  prompt_NxP: np.ndarray  # int32 ids, left-padded with 0: every prompt ends at column P
  prompt_len_N: np.ndarray  # int32, the real (unpadded) length of each prompt
  index_N: np.ndarray  # int32, the question each row poses (all of them unless drop_long)


# ---------------------------------------------------------------------------------------------
# Final answers.


def canonical_number(number: str) -> str:
  """One spelling per value: no `$` or commas, an ASCII `-`, no trailing zeros or `.0`, no `-0`."""
  value = decimal.Decimal(number.replace("$", "").replace(",", "").replace("\u2212", "-"))
  if value == value.to_integral_value():
    return str(int(value))
  return format(value.normalize(), "f")


def extract_final_answer(message: str) -> str | None:
  """The final answer in a model's text, as a canonical number; None when it gives none.

  GSM8K's conventions: the first number after the last `####` when the text has the mark (a mark with
  no number after it gives None: the model announced an answer and wrote none), else the last number.
  """
  marked = GSM8K_MARK in message
  numbers = _NUMBER.findall(message.rsplit(GSM8K_MARK, 1)[-1])
  if not numbers:
    return None
  return canonical_number(numbers[0] if marked else numbers[-1])


def wrong_solution(solution: str) -> str:
  """`solution` with the number its final answer is read from (`extract_final_answer`) one too high:
  a systematic mistake for warm-start demonstrations.  A text without a number is returned as is."""
  head, marked, tail = solution.rpartition(GSM8K_MARK)
  if not marked:
    head, tail = "", solution
  numbers = list(_NUMBER.finditer(tail))
  if not numbers:
    return solution
  number = numbers[0] if marked else numbers[-1]
  wrong = canonical_number(str(decimal.Decimal(canonical_number(number.group())) + 1))
  return head + marked + tail[:number.start()] + wrong + tail[number.end():]


def score(predicted_text: str, reference: str) -> int:
  """1 when the final answer of `predicted_text` equals `reference` as a number, else 0; `reference`
  is a final answer (as `load` returns) or a text holding one."""
  predicted = extract_final_answer(predicted_text)
  return int(predicted is not None and predicted == extract_final_answer(reference))


# ---------------------------------------------------------------------------------------------
# Reading.


def load(path: str, *, source: str = "auto", answer_style: str = "auto", question_key: str = "question",
         answer_key: str = "answer", split: str = "test") -> WordProblems:
  """The question/answer pairs of a jsonl file or a TFDS directory (`split` for tfds only), in order."""
  if source not in SOURCES:
    raise ValueError(f"source={source!r}; allowed: {SOURCES}")
  if answer_style not in ANSWER_STYLES:
    raise ValueError(f"answer_style={answer_style!r}; allowed: {ANSWER_STYLES}")
  if not os.path.exists(path):
    raise FileNotFoundError(f"word problems: {path} does not exist")
  if source == "auto":
    source = "tfds" if os.path.isdir(path) else "jsonl"
  keys = (question_key, answer_key)
  records = _read_tfds(path, split, keys) if source == "tfds" else _read_jsonl(path, keys)
  if not records:
    raise ValueError(f"{path} holds no word problems")
  if answer_style == "auto":
    answer_style = "gsm8k" if GSM8K_MARK in records[0][2] else "plain"
  answers = tuple(_reference(where, answer, answer_style) for where, _, answer in records)
  return WordProblems(tuple(question for _, question, _ in records), answers, path,
                      tuple(answer for _, _, answer in records))


def _read_jsonl(path: str, keys: tuple[str, str]) -> list[tuple[str, str, str]]:
  """(where, question, answer text) per non-blank line; `where` is `path:line` for error messages."""
  records = []
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, 1):
      if not line.strip():
        continue  # a blank line (e.g. a trailing newline) is not an example
      where = f"{path}:{line_number}"
      try:
        example = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not JSON ({e.msg}); each line must be one JSON object") from None
      if not isinstance(example, dict):
        raise ValueError(f"{where} is a JSON {type(example).__name__}; each line must be one JSON object")
      _check_fields(where, keys, example)
      records.append((where, *(_text(where, key, example[key]) for key in keys)))
  return records


def _read_tfds(path: str, split: str, keys: tuple[str, str]) -> list[tuple[str, str, str]]:
  """(where, question, answer text) per row of `split`; text features are stored as UTF-8 bytes."""
  if not os.path.isfile(os.path.join(path, "dataset_info.json")):
    raise ValueError(f"{path} is not a TFDS dataset directory (no dataset_info.json): pass the version "
                     "directory, e.g. DATA_DIR/gsm8k/1.0.0")
  builder = tfds.builder_from_directory(path)
  _check_fields(path, keys, builder.info.features)
  data_source = builder.as_data_source(split=split)  # never empty: TFDS writes no empty split
  columns = array_records.read_source(data_source)
  where = lambda i: f"{path} split {split!r} row {i}"
  decode = lambda value: value.decode("utf-8") if isinstance(value, bytes) else value
  return [(where(i), *(_text(where(i), key, decode(columns[key][i])) for key in keys))
          for i in range(len(data_source))]


def _check_fields(where: str, keys: tuple[str, str], example) -> None:
  for key, option in zip(keys, ("question_key", "answer_key")):
    if key not in example:
      raise ValueError(f"{where} has no field {key!r} ({option}); its fields: {sorted(example)}")


def _text(where: str, key: str, value) -> str:
  """A field as text: a string, or a number (a plain answer may be a JSON number)."""
  if isinstance(value, str):
    return value
  if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
    return str(value)
  raise ValueError(f"{where} field {key!r} is {value!r}; allowed: a string or a number")


def _reference(where: str, answer: str, answer_style: str) -> str:
  """The final answer of one answer field, strictly: a dataset whose answers do not parse is refused
  rather than scored against a guess."""
  if answer_style == "gsm8k":
    if GSM8K_MARK not in answer:
      raise ValueError(f"{where} answer has no '{GSM8K_MARK} N' line (answer_style='gsm8k'); for answers "
                       "that are the number itself use answer_style='plain'")
    final = extract_final_answer(answer)
    if final is None:
      raise ValueError(f"{where} answer has no number after '{GSM8K_MARK}'")
    return final
  if not _NUMBER.fullmatch(answer.strip()):
    raise ValueError(f"{where} answer {answer!r} is not a number (answer_style='plain'); for worked "
                     f"solutions ending in '{GSM8K_MARK} N' use answer_style='gsm8k'")
  return canonical_number(answer.strip())


# ---------------------------------------------------------------------------------------------
# Prompts for a checkpoint's tokenizer.


def encode_prompts(tok: lm_tokenizer.Tokenizer, questions: Sequence[str], max_prompt_len: int, *,
                   drop_long: bool = False, next_role: str | None = "assistant") -> Prompts:
  """Each question as the user turn of the chat layout, then the header of `next_role`'s turn: the
  prompt the model answers from (with `next_role=None` the user turn alone: the word-problem task's
  turns bring their own headers). Left-padded so that every answer starts at column P = max_prompt_len, as on the
  sampling canvas; the pad ids (0) are masked by `arange(P) >= P - prompt_len_N[:, None]`.

  A prompt longer than max_prompt_len is an error naming its index and length, or with drop_long it is
  left out (index_N lists the questions kept). Prompts are never truncated: a cut prompt would lose the
  header after which the model writes its answer.
  """
  ids = [tok.render_chat([("user", question)], next_role=next_role) for question in questions]
  fits = [len(x) <= max_prompt_len for x in ids]
  if not all(fits) and not drop_long:
    i = fits.index(False)
    raise ValueError(f"question {i} is {len(ids[i])} tokens as a prompt, over max_prompt_len={max_prompt_len} "
                     f"({fits.count(False)} of {len(ids)} are over); raise max_prompt_len or pass "
                     "drop_long=True")
  index_N = np.flatnonzero(fits).astype(np.int32)
  if not len(index_N):
    raise ValueError(f"none of the {len(ids)} questions fits in max_prompt_len={max_prompt_len} tokens")
  prompt_len_N = np.array([len(ids[i]) for i in index_N], np.int32)
  prompt_NxP = np.zeros((len(index_N), max_prompt_len), np.int32)
  for row, i in enumerate(index_N):
    prompt_NxP[row, max_prompt_len - prompt_len_N[row]:] = ids[i]
  return Prompts(prompt_NxP, prompt_len_N, index_N)
