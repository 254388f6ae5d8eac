r"""Word problems in free text with language-model agents: questions and answers from a local jsonl file
or TFDS directory (GSM8K's layout by default), posed in the checkpoint's chat layout, answered over the
model's whole vocabulary and scored by the final answer (docs/language_models.md).

  python -m marl_jax.main --config=experiments/lm_word_problems.py:size=tiny --workdir=/tmp/lm_wp
  python -m marl_jax.main --config=experiments/lm_word_problems.py:size=tiny,protocol=solver_verifier \
      --workdir=/tmp/lm_wp_sv
  python -m marl_jax.main --config=experiments/lm_word_problems.py:size=gpu,checkpoint=/models/Qwen3-0.6B,\
path=/data/gsm8k/train.jsonl,eval_path=/data/gsm8k/test.jsonl --workdir=/tmp/gsm8k_qwen

Arguments: size=tiny|cpu|gpu; protocol=single|solver_verifier|vote|debate|best_of_n (votes compare
final answers, `Task.vote_key`; the protocol's knobs are `--config.protocol.KEY`); checkpoint=DIR (tiny and cpu default
to the 2-layer random Qwen3 fixture in tests/fixtures/lm; gpu needs one); path=FILE_OR_DIR and
eval_path=... (tiny and cpu default to the hand-written fixtures in tests/fixtures/word_problems: the
plain set at tiny, the GSM8K-style set at cpu; gpu needs them); lora=false|true; sharing=shared|
isolated; credit=ESTIMATOR.  Prompt and message lengths are `--config.task.max_prompt_len` and
`.max_answer_len` (problems that do not fit are refused, or left out with `--config.task.drop_long`).
"""
import os

from marl_jax import configs

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, os.pardir, "tests", "fixtures"))
PROTOCOLS = ("single", "solver_verifier", "vote", "debate", "best_of_n")


def get_config(arg=None):
  args = configs.parse_arg(arg, size="tiny", protocol="single", checkpoint="", path="", eval_path="",
                           lora=False, sharing="isolated", credit="team")
  configs.check_choice("protocol", args.protocol, PROTOCOLS)
  if args.size == "gpu" and not (args.checkpoint and args.path):
    raise ValueError("config arguments checkpoint and path are required at size=gpu: a local Qwen3 or "
                     "Llama checkpoint directory and a jsonl file or TFDS directory of word problems")
  c = configs.base_config()
  c.protocol = configs.ml_collections.ConfigDict(dict(name=args.protocol))
  c.credit = configs.credit_config(args.credit)
  c.roles.sharing = args.sharing
  c.model.checkpoint = os.path.normpath(args.checkpoint or os.path.join(FIXTURES, "lm", "qwen3"))
  c.model.lora.enabled = args.lora
  plain = args.size == "tiny" and not args.path
  c.task = configs.ml_collections.ConfigDict(dict(
      name="word_problems",
      path=args.path or os.path.join(FIXTURES, "word_problems", "plain_tiny.jsonl" if plain
                                     else "gsm8k_tiny.jsonl"),
      eval_path=args.eval_path, split="train", eval_split="test",
      question_key="problem" if plain else "question", answer_key="final" if plain else "answer",
      answer_style="auto", max_prompt_len=96 if plain else 160, max_answer_len=8 if plain else 160,
      drop_long=False, demo_error_rate=0.5,
      chat_roles="agent:assistant" if args.protocol == "single" else ""))  # one agent: the assistant
  configs.apply_size(c, args.size)
  if args.size == "tiny":
    c.eval.size = 4  # the plain fixture's four questions
    c.rl.update(batch_size=16, group_size=4)
    c.sft.update(steps=4, batch_size=8)
  elif args.size == "cpu":
    c.eval.size = 7  # the GSM8K-style fixture's seven questions
    c.rl.update(batch_size=32, group_size=4, minibatches=1)
    c.sft.update(steps=50, batch_size=16)
    c.num_devices = 1  # seven questions do not split over more
  else:  # a 0.6B-class model on an accelerator
    # Passes small enough for an 80 GB GPU, whose JAX allocator gives a program 0.75 of it by default
    # (docs/lm_speed.md): canvases of ~500 tokens over a 151 936-word vocabulary, whose key-value
    # caches, attention maps and log-probs all grow with the rows in a pass.  The train call's planned
    # memory (compiled for the 2-core CPU, float32, Qwen3-0.6B's shapes) with 2 rows per update pass:
    # single 24.9 GiB, solver-verifier 54.3 GiB (30.5 and 70.8 GiB with 4 rows); the warm start with 4
    # rows per pass 21.5 and 52.6 GiB (155 and 464 GiB in one pass of 64).
    c.eval.update(size=512, batch_size=32)
    c.rl.update(batch_size=256, group_size=8, minibatches=4, microbatch_size=2, rollout_batch_size=64)
    c.sft.update(steps=200, batch_size=64, microbatch_size=4, learning_rate=1e-5)
    c.optim.learning_rate = 1e-6
  configs.fit_canvas(c)
  return c
