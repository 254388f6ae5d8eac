"""python -m marl_jax.main --config=experiments/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]"""
import os
import re
import sys

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from marl_jax import configs, credit, experiment, loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (with :ARG).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; an existing checkpoint is resumed.")
flags.mark_flags_as_required(["config", "workdir"])


def _flag_value(argv, name: str) -> str | None:
  """The value of flag `--NAME`, whether given as `--NAME=VALUE` or `--NAME VALUE` (absl takes both;
  the last one counts); None without one."""
  found = None
  for arg, after in zip(argv, [*argv[1:], None]):
    if arg.startswith(f"--{name}="):
      found = arg.partition("=")[2]
    elif arg == f"--{name}" and after is not None:
      found = after
  return found


def _selecting_credit(parse, name: str | None):
  """The config file's parser, then `config.credit` made the group of the estimator that
  `--config.credit.name=NAME` selects (`configs.credit_config`: its settings at their defaults, those
  it shares with the file's estimator at the file's values), so that the other --config.credit.KEY
  flags set that estimator's settings, not the file's estimator's.  An unknown NAME is left for
  `experiment.build` to refuse."""
  def parse_and_select(path):
    config = parse(path)
    if (name is not None and name in credit.REGISTRY and isinstance(config, ml_collections.ConfigDict)
        and "credit" in config and config.credit.name != name):
      with config.unlocked():
        config.credit = configs.credit_config(name, like=config.credit)
    return config
  return parse_and_select


def _unknown_key(argv) -> str | None:
  """The first --config.KEY=VALUE whose KEY the config lacks, with the keys allowed there."""
  config_file = _flag_value(argv, "config")
  if config_file is None:
    return None
  # The value is unset when an override failed: parse the file again.
  config = flags.FLAGS["config"].value or flags.FLAGS["config"].parser.parse(config_file)
  for arg in argv:
    names = arg.partition("=")[0].removeprefix("--").split(".")
    if names[0] != "config":
      continue
    group = config
    for depth, name in enumerate(names[1:], 1):
      if not isinstance(group, ml_collections.ConfigDict) or name not in group:
        allowed = sorted(group) if isinstance(group, ml_collections.ConfigDict) else []
        return f"flag {arg}: {'.'.join(names[:depth + 1])} is not a key; allowed: {allowed}"
      group = group[name]
  return None


def _parse_flags(argv):
  """absl's flag parsing, `--config.credit.name` selecting an estimator's settings (`_selecting_credit`),
  with each error on one line: a config file's own error without the traceback ml_collections puts in
  the message, and an unknown --config.KEY with the allowed keys."""
  parser = flags.FLAGS["config"].parser
  parser.parse = _selecting_credit(parser.parse, _flag_value(argv, "config.credit.name"))
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [line.strip() for line in str(e).strip().splitlines()]
    message = " ".join(dict.fromkeys([lines[0], lines[-1]]))
  except (AttributeError, KeyError):
    message = _unknown_key(argv)
    if message is None:
      raise
  sys.exit(f"FATAL Flags parsing error: {message}")


def _origin(message: str, argv) -> str:
  """` (from FLAGS)`: where the config keys `message` names were set, by --config.KEY flags or else
  by the config file; '' when it names none (a workdir's problem, say)."""
  keys = set(re.findall(r"config\.([\w.]+\w)", message)) - {"json"}
  given = [a for a in argv if a.partition("=")[0].removeprefix("--config.") in keys]
  config_file = [f"--config={value}" for value in [_flag_value(argv, "config")] if value]
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
  app.run(main, flags_parser=_parse_flags)
