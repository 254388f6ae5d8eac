"""Word problems in the step (`tasks.word_problems.WordProblems`, `lm.agent.canvas_ids`): the free-text canvas table of
each fixture tokenizer, the agent's whole-vocabulary logits against the decoder's, problems that decode
back to the file's questions and solutions, final answers scored inside a jitted function by hand-worked
cases, sampled tokens that are all the policy's to write, bad input refused before compiling, and tiny
runs through the real CLI (a warm start that learns the plain fixture's four answers)."""
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from marl_jax import configs, datasets, experiment, loop, rollout, sampling, tasks, text, transcripts
from marl_jax import word_problem_sets as wp
from marl_jax import workdir as workdir_lib
from marl_jax.lm import agent as lm_agent
from marl_jax.lm import hf_checkpoint
from marl_jax.lm import model as lm_model
from marl_jax.lm import tokenizer as lm_tokenizer
from marl_jax.protocols import vote
from marl_jax.tools import archive
from workflows_test import compiled_demonstrate, compiled_rewards

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
EXPERIMENT = REPO / "experiments" / "lm_word_problems.py"
PLAIN_ANSWERS = ("42", "1500", "-3", "2.5")  # tests/fixtures/word_problems/plain_tiny.jsonl
FAMILIES = ["qwen3", "llama"]


def _config(arg="size=tiny", **overrides):
  c = configs.sibling(str(EXPERIMENT), "lm_word_problems").get_config(arg)
  c.model.dtype = "float32"
  for key, value in overrides.items():
    group, name = key.split(".")
    c[group][name] = value
  if c.model.checkpoint and c.task.path:  # the canvas of the overrides (turn headers, message lengths)
    configs.fit_canvas(c)
  return c


@pytest.mark.parametrize("family", FAMILIES)
def test_canvas_ids(family):
  """Symbols first (role markers on control characters), then every ordinary token once, then the
  special tokens that are not symbols, which no policy may write."""
  tok = lm_tokenizer.load(str(FIXTURES / "lm" / family))
  vocab_size = hf_checkpoint.read_hf_config(str(FIXTURES / "lm" / family))["vocab_size"]
  ids_W, num_writable = lm_agent.canvas_ids(tok, vocab_size)
  symbols = lm_agent.symbol_ids(tok, free_text=True)
  assert ids_W[:text.VOCAB_SIZE] == symbols
  assert symbols[text.role_marker(2)] == tok.encode("\x12")[0]
  # `<absent>`, which no policy writes, is a control character too: "_" is ordinary text (it once was
  # `<absent>`, so no message could hold one and a demonstration with one scored log-prob -1e9).
  assert symbols[text.ABSENT] == tok.encode("\x1a")[0]
  underscore = ids_W.index(tok.encode("_")[0])
  assert text.VOCAB_SIZE <= underscore < num_writable
  assert symbols[text.TOKEN_ID["a"]] == lm_agent.symbol_ids(tok)[text.TOKEN_ID["a"]]
  # Every token of the tokenizer is a canvas value: symbols repeat only the end-of-turn id.
  assert set(ids_W) == set(range(vocab_size))
  assert len(ids_W) - text.VOCAB_SIZE == vocab_size - len(set(symbols))
  tail = {"qwen3": ["<|endoftext|>"], "llama": ["<|end_of_text|>", "<|start_header_id|>",
                                                  "<|end_header_id|>"]}[family]
  assert [tok.tok.id_to_token(i) for i in ids_W[num_writable:]] == tail


@pytest.mark.parametrize("family", FAMILIES)
def test_free_text_logits_are_the_decoders(family):
  agent = experiment.make_model(_config(**{"model.checkpoint": str(FIXTURES / "lm" / family)}).model,
                                free_text=True)
  params = jax.tree.map(lambda p: p[0], agent.pretrained_stack(1))
  tokens_BxL = jax.random.randint(jax.random.PRNGKey(0), (2, 7), 0, agent.num_writable)
  ok_BxL = jnp.ones((2, 7), bool)
  logits_BxLxW, _ = agent.apply(params, tokens_BxL, 0, ok_BxL)
  ids_W = np.asarray(agent.canvas_ids_V)
  full_BxLxV, _ = lm_model.apply(agent.lm, params, jnp.asarray(ids_W)[tokens_BxL], 0, ok_BxL)
  writable = agent.num_writable
  np.testing.assert_allclose(logits_BxLxW[..., :writable], full_BxLxV[..., ids_W[:writable]], atol=1e-5,
                             rtol=1e-5)
  assert (logits_BxLxW[..., writable:] == -1e9).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_problems_decode_to_the_file(family):
  """Prompts are the chat layout's user turn; demonstrations are the answer fields as written, and the
  wrong ones the same with the final answer one too high; a whole demonstrated transcript is the chat
  template's rendering of the conversation (the engine writes each turn's header)."""
  checkpoint = str(FIXTURES / "lm" / family)
  exp = experiment.build(_config(**{"model.checkpoint": checkpoint, "task.demo_error_rate": 1.0}))
  tok = lm_tokenizer.load(checkpoint)
  data = exp.task._data()  # pylint: disable=protected-access
  problems = jax.device_get(exp.task.eval_set(0, 4))
  source = wp.load(str(FIXTURES / "word_problems" / "plain_tiny.jsonl"), question_key="problem",
                   answer_key="final")
  for i in range(4):
    prompt = problems["prompt"][i]
    assert (prompt[:np.argmax(prompt != text.PAD)] == text.PAD).all()  # left-padded
    assert data.decode(prompt, message=False) == tok.decode(tok.render_chat([("user", source.questions[i])]))
    assert data.decode(problems["answer"][i]) == source.solutions[i]
    assert wp.extract_final_answer(data.decode(problems["wrong"][i])) == wp.canonical_number(
        str(float(PLAIN_ANSWERS[i]) + 1))
  np.testing.assert_array_equal(problems["index"], [4, 5, 6, 7])  # after the four training rows
  # Training draws every training row and never an evaluation question.
  drawn = jax.device_get(exp.task.sample_batch(jax.random.split(jax.random.PRNGKey(0), 64))["index"])
  assert set(drawn.tolist()) == set(range(data.num_train)) == {0, 1, 2, 3}
  for protocol, roles in (("single", ["assistant"]), ("solver_verifier", ["solver", "verifier"])):
    exp = experiment.build(_config(f"size=tiny,protocol={protocol}", **{"model.checkpoint": checkpoint,
                                                                          "task.demo_error_rate": 0.0}))
    tokens_BxT = jax.device_get(exp.protocol.demonstrate(exp.task, exp.layout, exp.task.eval_set(0, 4),
                                                         jax.random.split(jax.random.PRNGKey(0), 4)))
    for i in range(4):
      said = [data.decode(tokens_BxT[i, slice(*s)]) for s in exp.layout.turn_slices]
      conversation = [("user", source.questions[i])] + list(zip(roles, said))
      expected = tok.decode(tok.render_chat(conversation)).removesuffix(tok.layout.after_turn)
      if text.EOS not in tokens_BxT[i, slice(*exp.layout.turn_slices[-1])]:  # an accept ends the episode
        expected = expected.removesuffix(tok.layout.end_of_turn)
      assert data.decode(tokens_BxT[i], message=False) == expected


def _message(exp, words: str):
  """`words` then the end of turn, as canvas values of the task's message slot."""
  data = exp.task._data()  # pylint: disable=protected-access
  value_of_id = {int(i): v for v, i in enumerate(data.canvas_ids_W) if v >= text.VOCAB_SIZE or v > text.EOS}
  values = [value_of_id[i] for i in data.tokenizer.encode(words)] + [text.EOS]
  return np.pad(values, (0, exp.task.answer_len - len(values)))


def test_score_in_jit_by_hand():
  exp = experiment.build(_config(**{"task.max_answer_len": 24}))
  problems = exp.task.eval_set(0, 4)  # 7 x 6; $1,500; 10 - 13; half of 5
  messages = np.stack([_message(exp, m) for m in (
      "The answer is 42", "#### $1,500.", "it is 3", "2.50")])
  score_B = jax.jit(jax.vmap(exp.task.score))(problems, jnp.asarray(messages))
  np.testing.assert_array_equal(score_B, [1.0, 1.0, 0.0, 1.0])
  # Text after the end of turn is not read: "42" then EOS then "7" is still 42.
  late = _message(exp, "42")
  late[3] = _message(exp, "7")[0]
  assert float(jax.jit(exp.task.score)(jax.tree.map(lambda x: x[0], problems), jnp.asarray(late))) == 1.0


def test_votes_compare_final_answers():
  """Vote and debate on word problems: answers are the same vote when their final answers are, whatever
  the words around them; an answer with no number agrees only with the same text."""
  short = {"task.max_answer_len": 24}
  exp = experiment.build(_config("size=tiny,protocol=vote", **short))
  said = ["so 6 * 7 = 42", "#### 41", "The answer is 42.", "no idea", "no idea", "not sure"]
  messages_NxA = jnp.asarray(np.stack([_message(exp, m) for m in said]))
  key_NxK = np.asarray(jax.jit(jax.vmap(exp.task.vote_key))(messages_NxA))
  same = lambda i, j: bool(np.all(key_NxK[i] == key_NxK[j]))
  assert same(0, 2) and not same(0, 1) and same(3, 4) and not same(3, 5) and not same(0, 3)
  # Three voters per row: row 0 "42", "41", "42" (the majority is 42, voter0's words); row 1 "41",
  # "42", "42" (42 by two votes, in voter1's words); row 2 three different answers (the tie goes to voter0).
  rows = [[0, 1, 2], [1, 2, 0], [1, 0, 3]]
  answers_KxBxA = jnp.asarray(np.stack([[_message(exp, said[i]) for i in row] for row in rows], 1))
  final_BxA = jax.jit(lambda a: vote.majority(a, exp.protocol.vote_key))(answers_KxBxA)
  np.testing.assert_array_equal(final_BxA, answers_KxBxA[np.array([0, 1, 0]), np.arange(3)])
  debate = experiment.build(_config("size=tiny,protocol=debate", **short))
  assert debate.protocol.vote_key == debate.task.vote_key


@pytest.mark.parametrize("protocol", ["solver_verifier", "vote", "debate", "best_of_n"])
def test_demonstrations_scored_by_the_protocol_in_the_step_functions(protocol):
  """Each workflow on word problems: every right demonstration scores 1 and every wrong one 0,
  through the protocol's jitted rewards (the host callback under vmap)."""
  exp = experiment.build(_config(f"size=tiny,protocol={protocol}", **{"task.demo_error_rate": 0.5}))
  problems = exp.task.sample_batch(jax.random.split(jax.random.PRNGKey(1), 32))
  tokens_BxT = compiled_demonstrate(exp.protocol, exp.task, exp.layout, problems,
                                    jax.random.split(jax.random.PRNGKey(2), 32))
  scored = compiled_rewards(exp.protocol, exp.task, exp.layout, problems, tokens_BxT)
  answer_BxA = exp.protocol.final_answer(exp.layout, tokens_BxT)
  right_B = np.asarray(jnp.all(answer_BxA == problems["answer"], -1))
  assert 0 < right_B.sum() < 32
  np.testing.assert_array_equal(scored.team_B, right_B.astype(np.float32))


def test_sampled_tokens_are_the_policys():
  """Free text over the whole vocabulary: nothing sampled is a role marker, padding, BOS, <absent> or a
  special token of the tail, and some of it lies beyond the engine's symbols."""
  exp = experiment.build(_config(**{"sft.steps": 0}))
  state = loop.initial_state(exp)
  problems = exp.task.sample_batch(jax.random.split(jax.random.PRNGKey(3), 64))
  params_R = jax.tree.map(lambda p: p[0], state.params)
  episodes = jax.jit(lambda p, k: rollout.sample(exp, p, problems, k, False))(
      params_R, jax.random.split(jax.random.PRNGKey(4), 64))
  sampled = np.asarray(episodes.tokens_BxT)[np.asarray(episodes.sampled_BxT)]
  env_only = np.pad(sampling._ENV_ONLY_V, (0, exp.model.vocab_size - text.VOCAB_SIZE))  # pylint: disable=protected-access
  assert sampled.size and not env_only[sampled].any()
  assert (sampled < exp.model.num_writable).all() and (sampled >= text.VOCAB_SIZE).any()


def test_eval_set_archived_as_a_tfds_dataset(tmp_path):
  """`config.eval.data_dir` works for a file's questions too: the archive holds exactly its rows."""
  task = experiment.build(_config()).task
  loaded = datasets.load_eval_set(task, seed=0, size=4, data_dir=str(tmp_path))
  expected = jax.device_get(task.eval_set(0, 4))
  assert sorted(loaded) == sorted(expected)
  for k, v in expected.items():
    np.testing.assert_array_equal(loaded[k], v)


def test_transcripts_archived_read_back_as_text(tmp_path):
  """`marl_jax.tools.archive` of a free-text run: transcripts decode through the checkpoint's tokenizer."""
  exp = experiment.build(_config(**{"sft.steps": 0}))
  params_S = loop.initial_state(exp).params
  name = archive.archive(exp, params_S, str(tmp_path), "wp", greedy=True, with_credit=False)
  read = transcripts.load_transcripts(str(tmp_path), name.split("/")[1].split(":")[0])
  first = read.text(0)
  assert first.startswith("prompt: <|im_start|>user\nWhat is 7 times 6?<|im_end|>")
  assert "\nagent: " in first and "team reward 0.00" in first


def test_bad_input_is_refused_before_compiling(tmp_path):
  with pytest.raises(ValueError, match=r"config.task.name='word_problems' .*set config.model.checkpoint"):
    experiment.build(_config(**{"model.checkpoint": ""}))
  with pytest.raises(ValueError, match=r"config.task.path is empty"):
    experiment.build(_config(**{"task.path": ""}))
  with pytest.raises(ValueError, match=r"config.task.path='/nonexistent.jsonl': .*does not exist"):
    experiment.build(_config(**{"task.path": "/nonexistent.jsonl"}))
  with pytest.raises(ValueError, match=r"config.eval.size=8 is more than the 4 evaluation questions"):
    experiment.build(_config(**{"eval.size": 8}))
  gsm8k = str(FIXTURES / "word_problems" / "gsm8k_tiny.jsonl")
  long = {"task.path": gsm8k, "task.question_key": "question", "task.answer_key": "answer",
          "task.max_prompt_len": 160, "task.max_answer_len": 60, "model.max_len": 240}
  with pytest.raises(ValueError, match=r"5 of 7 problems do not fit .*max_answer_len=60 .*drop_long=True"):
    experiment.build(_config(**long))
  kept = experiment.build(_config(**long, **{"task.drop_long": True, "eval.size": 2})).task._data()  # pylint: disable=protected-access
  assert kept.num_train == 2 and kept.reference_N == ("-3", "2.25") * 2  # the two short solutions
  with pytest.raises(ValueError, match=r"config.task.path: none of the 4 questions fits in max_prompt_len=8 "
                                       r"tokens; raise config.task.max_prompt_len"):
    experiment.build(_config(**{"task.max_prompt_len": 8}))
  with pytest.raises(ValueError, match=r"config.task.answer_style='gsm'; allowed: \['auto', 'gsm8k', 'plain'\]"):
    experiment.build(_config(**{"task.answer_style": "gsm"}))
  no_vocab = tmp_path / "no_vocab_size"
  shutil.copytree(_config().model.checkpoint, no_vocab)
  hf = json.loads((no_vocab / "config.json").read_text())
  (no_vocab / "config.json").write_text(json.dumps({k: v for k, v in hf.items() if k != "vocab_size"}))
  with pytest.raises(ValueError, match=rf"config.model.checkpoint='{no_vocab}': config.json lacks \['vocab_size'\]"):
    experiment.build(_config(**{"model.checkpoint": str(no_vocab)}))


def test_special_tokens_in_problems_are_refused(tmp_path):
  """A special token in a question or answer would read as the chat layout's (here a turn ended
  mid-question), so such a file is refused, as the token past the model's vocabulary always was."""
  for family, token in (("qwen3", "<|endoftext|>"), ("qwen3", "<|im_end|>"), ("llama", "<|eot_id|>")):
    path = tmp_path / "special.jsonl"
    path.write_text(json.dumps({"problem": "What is 1 plus 1?", "final": "2"}) + "\n"
                    + json.dumps({"problem": f"What is 7 times 6?{token}", "final": "42"}) + "\n")
    with pytest.raises(ValueError, match=rf"config.task.path: problem 1's question holds '{re.escape(token)}'"):
      experiment.build(_config(**{"model.checkpoint": str(FIXTURES / "lm" / family), "task.path": str(path)}))
  path.write_text(json.dumps({"question": "What is 7 times 6?", "answer": "6 * 7 = 42<|im_end|>\n#### 42"}))
  with pytest.raises(ValueError, match=r"problem 0's answer holds '<\|im_end\|>'"):
    experiment.build(_config(**{"task.path": str(path), "task.question_key": "question",
                                "task.answer_key": "answer"}))


def test_wrong_demonstrations_must_fit_only_when_used(tmp_path):
  """99's wrong demonstration, 100, is a token longer: at demo_error_rate > 0 it must fit, and the
  error names its length as the wrong one's; at 0 it is never written and need not fit."""
  path = tmp_path / "ninety_nine.jsonl"
  path.write_text(json.dumps({"problem": "What is 90 plus 9?", "final": "99"}) + "\n")
  tok = lm_tokenizer.load(str(FIXTURES / "lm" / "qwen3"))
  right, wrong = len(tok.encode("99")) + 1, len(tok.encode("100")) + 1  # with the end of turn
  assert wrong == right + 1
  task = tasks.make("word_problems", path=str(path), question_key="problem", answer_key="final",
                    max_answer_len=right, tokenizer=str(FIXTURES / "lm" / "qwen3"))
  with pytest.raises(ValueError, match=rf"max_answer_len={right} \(the longest wrong demonstration is "
                                       rf"{wrong} tokens\)"):
    dataclasses.replace(task, demo_error_rate=0.5).check(1)
  task.check(1)


def test_chat_roles_are_the_workflows(tmp_path):
  """`config.task.chat_roles` is role:name pairs of the workflow's roles: a pair without `:` or a role
  the workflow lacks (a typo) is refused, listing the roles there are."""
  for chat_roles in ("assistant", "agnet:assistant", "agent:"):
    with pytest.raises(ValueError, match=rf"config.task.chat_roles='{chat_roles}'; allowed: comma-separated "
                                         r"role:name pairs, each role one of this workflow's \['agent'\]"):
      experiment.build(_config(**{"task.chat_roles": chat_roles}))
  exp = experiment.build(_config("size=tiny,protocol=solver_verifier", **{"task.chat_roles": "verifier:judge"}))
  data = exp.task._data()  # pylint: disable=protected-access
  assert [data.tokenizer.decode(data.canvas_ids_W[list(h)]) for h in exp.task.turn_headers(("solver", "verifier"))
          ] == ["<|im_start|>solver\n", "\n<|im_start|>judge\n"]


def test_a_run_saved_with_the_old_chat_roles_resumes_and_builds(tmp_path):
  """experiments/lm_word_problems.py once saved chat_roles "agent:assistant" for every workflow (naming
  no role outside `single`): such a run's workdir still resumes under today's file and rebuilds its
  experiment (archive, export), its roles speaking under their own names as they did."""
  config = _config("size=tiny,protocol=solver_verifier")
  saved = config.to_dict()
  saved["task"]["chat_roles"] = "agent:assistant"
  (tmp_path / "config.json").write_text(json.dumps(saved))
  workdir_lib.check(config, str(tmp_path))
  exp = experiment.build(configs.with_new_defaults(ml_collections.ConfigDict(saved)))
  assert exp.task.chat_roles == ""


def test_roles_on_other_models_read_the_tasks_tokenizer():
  """The task is posed through config.model.checkpoint's tokenizer: roles all on Llama models while
  config.model is Qwen3 would read a Qwen3 chat layout through Llama's, so that is refused; roles on
  models of config.model's tokenizer are not."""
  config = _config("size=tiny,protocol=solver_verifier")
  configs.add_model(config, "solver", checkpoint=str(FIXTURES / "lm" / "llama"))
  configs.add_model(config, "verifier", checkpoint=str(FIXTURES / "lm" / "llama"))
  config.roles.models = "solver,verifier"
  with pytest.raises(ValueError, match=r"config.roles.models='solver,verifier': the free-text task is posed "
                                       r"through the tokenizer of config.model.checkpoint='.*qwen3', which the "
                                       r"roles' models \(config.models.solver.checkpoint, "
                                       r"config.models.verifier.checkpoint\) do not read"):
    experiment.build(config)
  config.models.solver.checkpoint = config.models.verifier.checkpoint = config.model.checkpoint
  experiment.build(config)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["single", "solver_verifier", "vote"])
def test_tiny_runs_through_the_cli(protocol, tmp_path):
  """The plain fixture's four questions, warm-started on right demonstrations long enough to learn
  them: the greedy answers in free text, scored by their final answers, are all right."""
  workdir = tmp_path / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = subprocess.run(
      [sys.executable, "-m", "marl_jax.main", f"--config={EXPERIMENT}:size=tiny,protocol={protocol}",
       f"--workdir={workdir}", "--config.sft.steps=60", "--config.sft.learning_rate=3e-3",
       "--config.task.demo_error_rate=0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 2, 4]
  assert rows[0]["eval_accuracy"] == 1.0
  losses = [v for r in rows for k, v in r.items() if k.endswith("/loss")]
  assert losses and np.isfinite(losses).all()
