"""python -m marl_jax.main --config=experiments/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]"""
import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from marl_jax import cli, experiment, loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (with :ARG).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; an existing checkpoint is resumed.")
flags.mark_flags_as_required(["config", "workdir"])


def _origin(message: str, argv) -> str:
  """` (from FLAGS)`: where the config keys `message` names were set, by --config.KEY flags or else
  by the config file; '' when it names none (a workdir's problem, say).  A group it names
  (`config.task.*`) stands for every key under it."""
  keys = set(re.findall(r"config\.([\w.]+\w)", message)) - {"json"}
  named = lambda key: any(key == k or key.startswith(k + ".") for k in keys)
  given = [a for a in argv if a.startswith("--config.") and named(a.partition("=")[0].removeprefix("--config."))]
  config_file = [f"--config={value}" for value in [cli.flag_value(argv, "config")] if value]
  return f" (from {', '.join(given or config_file)})" if keys else ""


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  try:
    loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (experiment.ConfigError, loop.NonFiniteError) as e:
    sys.stdout.flush()
    sys.stderr.flush()
    # After a failed restore, tensorstore's pending reads print tracebacks of orbax's closed event
    # loop from their own threads: stderr goes quiet first, so the error is the last line (on a line
    # of its own, should a traceback be cut mid-line), and the process ends at once (metrics and
    # saves are already closed).
    stderr_fd = os.dup(2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    os.write(stderr_fd, f"\nFATAL {type(e).__name__}: {e}{_origin(str(e), sys.argv)}\n".encode())
    os._exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
