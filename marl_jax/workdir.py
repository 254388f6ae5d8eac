"""The workdir a run writes (config.json, metrics.jsonl, tensorboard/, checkpoints/): whether this run
may use it, checked before anything is written, and replacing a file there in one step."""
import functools
import json
import os

import ml_collections

# The groups and keys that make a run's state, problems, seeds and evaluation set (eval.data_dir only
# says where that set is stored): resuming under different ones would mix two runs, and the report
# would label one run's seeds or evaluations as another's.
IDENTITY = ("task", "model", "protocol", "roles", "seed", "num_seeds", "eval.seed", "eval.size")
# A mixed team's other model configs make the run too; a run saved before they existed has none.
LATER_IDENTITY = ("models",)
FILES = ("config.json", "metrics.jsonl", "tensorboard", "checkpoints")


def write_atomically(path: str, text: str) -> None:
  """Replaces `path` by `text` in one step: a crash leaves the old file or the new one, never a part."""
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _get(config: dict, key: str):
  """The value of a dotted `key` in `config`; None where it has none."""
  return functools.reduce(lambda c, part: c.get(part) if isinstance(c, dict) else None, key.split("."), config)


def _differences(saved: dict, now: dict, prefix: str) -> list[str]:
  """`KEY: SAVED -> NOW` for each key both hold with different values (a key that only one holds is a
  setting added or removed since, at its default)."""
  out = []
  for key in sorted(set(saved) & set(now)):
    if isinstance(saved[key], dict) and isinstance(now[key], dict):
      out += _differences(saved[key], now[key], f"{prefix}{key}.")
    elif saved[key] != now[key]:
      out.append(f"config.{prefix}{key}: {saved[key]!r} there, {now[key]!r} now")
  return out


def check(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses (ValueError) a workdir this run must not write: one it cannot write to, one that
  holds a run's files without their config.json (or with an unreadable one), and one whose run had
  another IDENTITY (task, model, protocol, roles, seeds or evaluation set).  Reads only."""
  existing = workdir
  while not os.path.exists(existing):
    existing = os.path.dirname(os.path.abspath(existing))
  paths = [existing] + [p for p in (os.path.join(workdir, f) for f in FILES) if os.path.exists(p)]
  for path in paths:
    if not os.access(path, os.W_OK | (os.X_OK if os.path.isdir(path) else 0)):
      raise ValueError(f"--workdir={workdir}: {path} is not writable (read-only file system or "
                        f"permissions); give a workdir this run can write")
  if not os.path.isdir(workdir):
    return
  config_json = os.path.join(workdir, "config.json")
  if not os.path.exists(config_json):
    found = [f for f in FILES[1:] if os.path.exists(os.path.join(workdir, f))]
    if found:
      raise ValueError(f"--workdir={workdir} holds {found} but no config.json: not a marl_jax run, or "
                        f"one whose config.json was lost; give a new or empty workdir")
    return
  error = None
  try:
    with open(config_json) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    saved, error = None, e
  if not isinstance(saved, dict) or any(_get(saved, key) is None for key in IDENTITY):
    raise ValueError(f"--workdir={workdir}: its config.json is unreadable or not a marl_jax config "
                      f"({error if saved is None else 'no ' + '/'.join(IDENTITY)}); give a new workdir")
  now = json.loads(config.to_json())
  keys = [key for key in IDENTITY + LATER_IDENTITY if _get(saved, key) is not None]
  differences = _differences({k: _get(saved, k) for k in keys}, {k: _get(now, k) for k in keys}, "")
  if differences:
    raise ValueError(f"--workdir={workdir} holds a run of a different config ({'; '.join(differences)}): "
                      f"resuming it needs the same {'/'.join(IDENTITY)}; give a new workdir "
                      f"(--config.init_from={workdir} starts one from its parameters, when they fit)")
