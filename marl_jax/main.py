"""python -m marl_jax.main --config=experiments/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]"""
from absl import app, flags, logging
from ml_collections import config_flags

from marl_jax import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (with :ARG).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; an existing checkpoint is resumed.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
