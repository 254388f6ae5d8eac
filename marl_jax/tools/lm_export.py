"""Writes one trained role of a language-model run back as a Hugging Face checkpoint, to serve elsewhere.

  python -m marl_jax.tools.lm_export --workdir=DIR --role=verifier --out=OUT [--seed=0] [--best]

OUT gets `config.json` (with the source's token ids and context length) and `model.safetensors`
(float32) from `lm.hf_checkpoint.save`, and the source checkpoint's tokenizer files (`TOKENIZER_FILES`
it has: the chat template and generation settings a server reads): the role's parameter set of seed
`--seed` at the run's latest checkpoint (or its best-evaluated one with `--best`), with its LoRA
adapters merged into the weights.
"""
import argparse
import os
import shutil

import jax
import numpy as np

from marl_jax import cli, configs, experiment, loop
from marl_jax import model as model_lib
from marl_jax.lm import agent as lm_agent
from marl_jax.lm import hf_checkpoint

# Newer transformers write the chat template to a file of its own (named variants to a folder).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "chat_template.json", "additional_chat_templates")


def export(workdir: str, role: str, out: str, seed: int = 0, best: bool = False) -> None:
  # Before the checkpoint is read; a directory of other files (a run's checkpoints/, say) would be
  # broken by the files written beside them.
  if os.path.isdir(out) and os.listdir(out):
    raise FileExistsError(f"--out={out} holds {sorted(os.listdir(out))[:4]}; allowed: a new or empty "
                          "directory")
  config = configs.read_run_config(workdir)
  exp = experiment.build(config)
  if role not in exp.protocol.roles:
    raise ValueError(f"--role={role!r} is not a role of this run; allowed: {list(exp.protocol.roles)}")
  role_set = exp.role_set_R[exp.protocol.roles.index(role)]
  model = model_lib.set_model(exp.model, role_set)  # in a mixed team, the role's own model
  if not isinstance(model, lm_agent.LMAgent):
    raise ValueError(f"--workdir={workdir}: role {role!r} is the built-in model (its model config has no "
                     f"checkpoint); only a language-model role exports to the Hugging Face format")
  if not 0 <= seed < config.num_seeds:
    raise ValueError(f"--seed={seed}: the run has seeds 0..{config.num_seeds - 1}")
  params_S = loop.load_params(exp, workdir + (":best" if best else ""),
                             flag=f"--workdir={workdir}{' --best' if best else ''}")
  params = model_lib.take_sets(exp.model, jax.tree.map(lambda p: np.asarray(p[seed]), params_S), role_set)
  hf_checkpoint.save(out, model.lm, model.servable(params), hf_checkpoint.read_hf_config(model.checkpoint))
  copy_tokenizer_files(model.checkpoint, out)


def copy_tokenizer_files(checkpoint: str, out: str) -> None:
  """The `TOKENIZER_FILES` that `checkpoint` has, into `out`."""
  for name in TOKENIZER_FILES:
    source = os.path.join(checkpoint, name)
    if os.path.isdir(source):
      shutil.copytree(source, os.path.join(out, name))
    elif os.path.exists(source):
      shutil.copy(source, out)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m marl_jax.tools.lm_export", description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="a language-model run (config.json, checkpoints)")
  parser.add_argument("--role", required=True, help="the role whose parameter set to write")
  parser.add_argument("--out", required=True, help="a new directory for the Hugging Face checkpoint")
  parser.add_argument("--seed", type=int, default=0, help="which of the run's vmapped seeds")
  parser.add_argument("--best", action="store_true", help="the best-evaluated checkpoint, not the latest")
  args = parser.parse_args(argv)
  with cli.refusing_bad_input(parser):
    export(args.workdir, args.role, args.out, args.seed, args.best)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
