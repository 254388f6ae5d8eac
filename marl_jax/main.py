"""python -m marl_jax.main --config=experiments/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]"""
import os
import re
import sys

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from marl_jax import configs, experiment, loop

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


def _selecting(parse, argv):
  """The config file's parser, then each of `config.task`, `config.protocol`, `config.credit` whose
  `--config.KEY.name=NAME` flag names another registered one made NAME's group
  (`configs.named_group`: its settings at their defaults, those it shares with the file's at the
  file's values), so that the other --config.KEY.* flags set NAME's settings, not the file's one's.
  An unknown NAME is left for `experiment.build` to refuse."""
  def parse_and_select(path):
    config = parse(path)
    for key in configs.NAMED_GROUPS:
      name = _flag_value(argv, f"config.{key}.name")
      if (name is None or not isinstance(config, ml_collections.ConfigDict) or key not in config
          or config[key].get("name") == name):
        continue
      try:
        group = configs.named_group(key, name, like=config[key])
      except ValueError:
        continue
      with config.unlocked():
        config[key] = group
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
  """absl's flag parsing, `--config.credit.name` and the like selecting their settings (`_selecting`),
  with each error on one line: a config file's own error without the traceback ml_collections puts in
  the message, and an unknown --config.KEY with the allowed keys."""
  parser = flags.FLAGS["config"].parser
  parser.parse = _selecting(parser.parse, argv)
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
