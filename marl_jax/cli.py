"""What the command lines share: each error on one line.  Flag parsing for the absl CLIs (the config-file
ones, `main` and `benchmark`, and `throughput`); bad input to the argparse ones (`report`, `archive`,
`tools.lm_export`)."""
import argparse
import contextlib
import sys

import ml_collections
from absl import flags

from marl_jax import configs


def flag_value(argv, name: str) -> str | None:
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
  """The config file's parser, then each of `config.task`, `config.protocol`, `config.credit`,
  `config.reward` whose `--config.KEY.name=NAME` (`.pay=NAME`) flag names another registered one made
  NAME's group
  (`configs.named_group`: its settings at their defaults, those it shares with the file's at the
  file's values), so that the other --config.KEY.* flags set NAME's settings, not the file's one's.
  An unknown NAME is left for `experiment.build` to refuse."""
  def parse_and_select(path):
    config = parse(path)
    if type(config).__name__ == "_ErrorConfig":  # ml_collections defers a file it cannot load to first use
      error = object.__getattribute__(config, "_error")
      raise ValueError(f"cannot load {path.split(':', 1)[0]!r}: {str(error).strip().splitlines()[-1].strip()}")
    for key in configs.NAMED_GROUPS:
      name = flag_value(argv, f"config.{key}.{configs.selector(key)}")
      if (name is None or not isinstance(config, ml_collections.ConfigDict) or key not in config
          or config[key].get(configs.selector(key)) == name):
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
  config_file = flag_value(argv, "config")
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


def parse_flags(argv):
  """absl's flag parsing, `--config.credit.name` and the like selecting their settings (`_selecting`),
  with each error on one line (absl's own adds a line of help): a config file's own error without the
  traceback ml_collections puts in the message, and an unknown --config.KEY with the allowed keys.  A
  CLI without a --config flag gets the one line alone."""
  if "config" in flags.FLAGS:
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


@contextlib.contextmanager
def refusing_bad_input(parser: argparse.ArgumentParser):
  """What a user's input causes (a ValueError: a bad name or value; a file missing or in the way) ends
  the command with `PROG: MESSAGE` and exit status 1, no traceback."""
  try:
    yield
  except (ValueError, FileNotFoundError, FileExistsError) as e:
    parser.exit(1, f"{parser.prog}: {e}\n")
