r"""Solver-verifier on multi-step arithmetic with language-model agents: a local Qwen3/Llama checkpoint
(Hugging Face format) instead of the built-in transformer, one parameter set per role stacked as usual.
The step, the warm start and every credit estimator are the solver-verifier experiment's; only the
model differs (docs/language_models.md).

  python -m marl_jax.main --config=experiments/lm_solver_verifier.py:size=tiny --workdir=/tmp/lm_sv
  python -m marl_jax.main --config=experiments/lm_solver_verifier.py:size=gpu,checkpoint=/models/Qwen3-0.6B \
      --workdir=/tmp/lm_sv_gpu
  python -m marl_jax.main --config=experiments/lm_solver_verifier.py:size=tiny,lora=true --workdir=/tmp/lm_sv_lora
  python -m marl_jax.main --config=experiments/lm_solver_verifier.py:size=tiny,verifier_checkpoint=tests/fixtures/lm/llama \
      --workdir=/tmp/lm_sv_mixed
  python -m marl_jax.tools.lm_export --workdir=/tmp/lm_sv_gpu --role=verifier --out=/tmp/verifier_hf

Arguments: size=tiny|cpu|gpu; checkpoint=DIR (a directory with config.json, the safetensors weights
and tokenizer.json; tiny and cpu default to the 2-layer random Qwen3 fixture in tests/fixtures/lm,
gpu needs one); random_weights=false|true (the checkpoint's shapes, randomly initialised: enough to
measure speed); lora=false|true (train low-rank adapters per parameter set on the frozen checkpoint;
`--config.model.lora.rank`, `.alpha`, `.targets`); sharing=shared|isolated; credit=ESTIMATOR;
verifier_checkpoint=DIR (a mixed team: the verifier runs this checkpoint, `config.models.verifier`,
the solver `checkpoint`; e.g. a small solver and a larger verifier, or two architectures).
"""
import os

from marl_jax import configs

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "fixtures", "lm",
                       "qwen3")


def get_config(arg=None):
  args = configs.parse_arg(arg, size="tiny", checkpoint="", random_weights=False, lora=False,
                           sharing="isolated", credit="team", verifier_checkpoint="")
  c = configs.sibling(__file__, "solver_verifier").get_config(
      f"size={args.size},sharing={args.sharing},credit={args.credit}")
  if args.size == "gpu" and not args.checkpoint:
    raise ValueError("config argument checkpoint is required at size=gpu: the directory of a local "
                     "Hugging Face-format Qwen3 or Llama checkpoint (e.g. Qwen3-0.6B)")
  c.model.checkpoint = os.path.normpath(args.checkpoint or FIXTURE)
  c.model.random_weights = args.random_weights
  c.model.lora.enabled = args.lora  # rank, alpha, targets: --config.model.lora.KEY
  if args.size == "gpu":  # a 0.6B-class model: fewer episodes per step than the built-in model's
    # 64 rows per pass: on an H200 the first train call of a whole 128-row minibatch's pass failed to
    # allocate 39.66 GiB (with preallocation off); 32 and 64 rows trained, 64 faster
    # (docs/language_models.md).
    c.rl.update(batch_size=512, minibatches=4, microbatch_size=64)
    c.sft.update(steps=200, batch_size=128, learning_rate=1e-5)
    c.optim.learning_rate = 1e-6
  if args.verifier_checkpoint:
    if args.sharing != "isolated":
      raise ValueError("config argument verifier_checkpoint gives the verifier its own model; it needs "
                       "sharing=isolated")
    configs.add_model(c, "verifier", checkpoint=os.path.normpath(args.verifier_checkpoint))
    c.roles.models = "model,verifier"
  return c
