"""Word problems: the readers (jsonl in both answer styles, a TFDS directory built here) and their errors,
final-answer extraction and scoring by hand, prompts for the fixture tokenizers.  (Evaluation sets in words:
datasets_test.py.)"""
import json
import pathlib

import numpy as np
import pytest
from tensorflow_datasets.text import gsm8k

from marl_jax.lm import tokenizer as lm_tokenizer
from marl_jax import word_problem_sets as wp

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
GSM8K_TINY = str(FIXTURES / "word_problems" / "gsm8k_tiny.jsonl")
PLAIN_TINY = str(FIXTURES / "word_problems" / "plain_tiny.jsonl")
GSM8K_ANSWERS = ("27", "270", "1485", "28", "6", "-3", "2.25")  # worked out by hand in the fixture


# ---------------------------------------------------------------------------------------------
# Final answers.


@pytest.mark.parametrize("message, expected", [
    ("so she has 27 stickers.\n#### 27", "27"),  # the mark wins...
    ("#### 12\nand then 99 more", "12"),  # ...over any later number,
    ("first #### 5, no wait\n#### 7", "7"),  # and the last mark over earlier ones
    ("#### no number here", None),  # an announced answer that is not there
    ("#### $1,000.", "1000"),
    ("5 + 5 = 10, so the answer is 12", "12"),  # no mark: the last number
    ("The total is $1,485.", "1485"),  # `$`, thousands commas and a closing `.` go
    ("It costs 1,250 dollars", "1250"),
    ("Pick 1,2,3", "3"),  # commas between small numbers separate them
    ("It is 42.0", "42"),
    ("It is 2.50 metres", "2.5"),
    ("The temperature is -3", "-3"),
    ("-0", "0"),
    ("10-3", "3"),  # a `-` after a digit is an operator, not a sign
    ("<<4-7=-3>>-3 degrees", "-3"),
    ("The answer is .5", "0.5"),  # a number with no integer part
    ("#### .75", "0.75"),
    ("She ends with \u22125 dollars", "-5"),  # the minus sign U+2212 is a sign...
    ("10\u22123", "3"),  # ...or an operator, as `-` is
    ("no numbers at all", None),
])
def test_extract_final_answer(message, expected):
  assert wp.extract_final_answer(message) == expected


def test_score():
  assert wp.score("So 36 - 9 = 27.\n#### 27", "27") == 1
  assert wp.score("The answer is 42.0.", "42") == 1
  assert wp.score("It costs $1,000", "1000") == 1
  assert wp.score("The answer is -3", "3") == 0
  assert wp.score("#### 28", "2.8") == 0
  assert wp.score("I do not know", "42") == 0
  # A reference that is itself a worked solution is read the same way.
  assert wp.score("#### 6", "24 / 4 = 6\n#### 6") == 1
  # No answer on either side is not agreement.
  assert wp.score("no idea", "nothing") == 0


# ---------------------------------------------------------------------------------------------
# Readers.


def test_gsm8k_jsonl():
  problems = wp.load(GSM8K_TINY)  # auto: a file is jsonl; its first answer holds '####'
  assert problems.answers == GSM8K_ANSWERS
  assert problems.questions[0].startswith("Mia buys 3 packs") and len(problems.questions) == 7
  assert problems.source == GSM8K_TINY
  assert wp.load(GSM8K_TINY, source="jsonl", answer_style="gsm8k") == problems


def test_plain_jsonl_with_its_own_field_names():
  problems = wp.load(PLAIN_TINY, question_key="problem", answer_key="final")
  assert problems.answers == ("42", "1500", "-3", "2.5")  # strings and JSON numbers alike
  assert problems.questions[0] == "What is 7 times 6?"
  assert wp.load(PLAIN_TINY, answer_style="plain", question_key="problem", answer_key="final") == problems


def _gsm8k_tfds(data_dir, jsonl: str) -> str:
  """TFDS's own gsm8k builder fed a local jsonl instead of the download: the catalog's features
  (question, answer, annotation, short_answer as text) in array_record files. Returns its directory."""
  class Gsm8kFixture(gsm8k.Gsm8k, skip_registration=True):
    def _split_generators(self, dl_manager):
      del dl_manager
      return {"test": self._generate_examples(jsonl)}
  builder = Gsm8kFixture(data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare()
  return str(builder.data_dir)


def test_tfds_directory(tmp_path):
  path = _gsm8k_tfds(tmp_path, GSM8K_TINY)
  problems = wp.load(path)  # auto: a directory is TFDS; gsm8k answers
  # TFDS shuffles the rows when it writes them; the pairs are those of the jsonl.
  jsonl = wp.load(GSM8K_TINY)
  assert sorted(zip(problems.questions, problems.answers)) == sorted(zip(jsonl.questions, jsonl.answers))
  short = wp.load(path, source="tfds", answer_key="short_answer")  # the catalog's bare final answers
  assert short.answers == problems.answers
  assert wp.load(path, split="test[:2]").questions == problems.questions[:2]  # TFDS's split slicing
  with pytest.raises(ValueError, match="Unknown split 'train'"):
    wp.load(path, split="train")
  with pytest.raises(ValueError, match=r"has no field 'problem' \(question_key\); its fields: \['annotation', "
                                       r"'answer', 'question', 'short_answer'\]"):
    wp.load(path, question_key="problem")
  with pytest.raises(ValueError, match="is not a TFDS dataset directory"):
    wp.load(str(tmp_path))


def _write(tmp_path, lines: list[str]) -> str:
  path = tmp_path / "problems.jsonl"
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def test_reader_errors(tmp_path):
  good = json.dumps({"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"})
  with pytest.raises(FileNotFoundError, match="nowhere.jsonl does not exist"):
    wp.load(str(tmp_path / "nowhere.jsonl"))
  with pytest.raises(ValueError, match=r"problems.jsonl:3 is not JSON"):
    wp.load(_write(tmp_path, [good, "", "{'question': 1}"]))  # blank lines are skipped, not counted out
  with pytest.raises(ValueError, match=r"problems.jsonl:2 is a JSON list"):
    wp.load(_write(tmp_path, [good, "[1, 2]"]))
  with pytest.raises(ValueError, match=r"problems.jsonl:2 has no field 'answer' \(answer_key\); its fields: "
                                       r"\['question', 'solution'\]"):
    wp.load(_write(tmp_path, [good, json.dumps({"question": "q", "solution": "#### 3"})]))
  with pytest.raises(ValueError, match=r"problems.jsonl:1 field 'question' is None; allowed: a string"):
    wp.load(_write(tmp_path, [json.dumps({"question": None, "answer": "3"})]))
  with pytest.raises(ValueError, match="holds no word problems"):
    wp.load(_write(tmp_path, [""]))
  with pytest.raises(ValueError, match=r"problems.jsonl:2 answer has no '#### N' line"):
    wp.load(_write(tmp_path, [good, json.dumps({"question": "q", "answer": "it is 3"})]))
  with pytest.raises(ValueError, match=r"problems.jsonl:1 answer has no number after '####'"):
    wp.load(_write(tmp_path, [json.dumps({"question": "q", "answer": "#### three"})]))
  with pytest.raises(ValueError, match=r"problems.jsonl:1 answer 'it is 3' is not a number"):
    wp.load(_write(tmp_path, [json.dumps({"question": "q", "answer": "it is 3"})]))
  with pytest.raises(ValueError, match=r"source='csv'; allowed: \('auto', 'jsonl', 'tfds'\)"):
    wp.load(GSM8K_TINY, source="csv")
  with pytest.raises(ValueError, match=r"answer_style='math'; allowed: \('auto', 'gsm8k', 'plain'\)"):
    wp.load(GSM8K_TINY, answer_style="math")


# ---------------------------------------------------------------------------------------------
# Prompts.


@pytest.mark.parametrize("family", ["qwen3", "llama", "llama_chatml"])
def test_encode_prompts(family):
  tok = lm_tokenizer.load(str(FIXTURES / "lm" / family))
  questions = wp.load(GSM8K_TINY).questions
  ids = [tok.render_chat([("user", q)], next_role="assistant") for q in questions]
  P = max(map(len, ids)) + 3
  prompts = wp.encode_prompts(tok, questions, P)
  assert prompts.prompt_NxP.shape == (7, P) and prompts.prompt_NxP.dtype == np.int32
  assert prompts.prompt_len_N.dtype == np.int32 and prompts.index_N.tolist() == list(range(7))
  for row, x in zip(prompts.prompt_NxP, ids):
    np.testing.assert_array_equal(row[P - len(x):], x)  # ends at column P, where the answer starts
    assert not row[:P - len(x)].any()
  # The user turn, then the assistant's header, in the layout of the checkpoint's tokenizer files.
  chatml = f"<|im_start|>user\n{questions[0]}<|im_end|>\n<|im_start|>assistant\n"
  assert tok.decode(prompts.prompt_NxP[0, P - prompts.prompt_len_N[0]:]) == {
      "qwen3": chatml,
      "llama": (f"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{questions[0]}<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"),
      "llama_chatml": chatml,  # the Llama architecture, ChatML tokens
  }[family]

  # Too long: an error naming the first prompt over, or with drop_long the rest.
  lengths = [len(x) for x in ids]
  P = sorted(lengths)[3]
  first = next(i for i, n in enumerate(lengths) if n > P)
  with pytest.raises(ValueError, match=rf"question {first} is {lengths[first]} tokens as a prompt, over "
                                       rf"max_prompt_len={P} \(3 of 7 are over\)"):
    wp.encode_prompts(tok, questions, P)
  kept = wp.encode_prompts(tok, questions, P, drop_long=True)
  assert kept.index_N.tolist() == [i for i, n in enumerate(lengths) if n <= P]
  assert kept.prompt_NxP.shape == (4, P) and kept.prompt_len_N.tolist() == [lengths[i] for i in kept.index_N]
  with pytest.raises(ValueError, match="none of the 7 questions fits in max_prompt_len=5"):
    wp.encode_prompts(tok, questions, 5, drop_long=True)
