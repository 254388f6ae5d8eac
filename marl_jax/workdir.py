"""The workdir a run writes (config.json, metrics.jsonl, tensorboard/, checkpoints/): whether this run
may use it, checked before anything is written."""
import dataclasses
import functools
import json
import os

import ml_collections

from marl_jax import checkpoint, configs, credit, protocols, tasks

# The settings a resumed run may change: how far it runs, how often it records, where its evaluation
# set is stored, and how its computation is laid out on the machine (the same updates, to float
# rounding).  Every other setting made the run so far: resuming under another would mix two runs
# under one config.json, which the report and archive then label with the new settings.
MAY_CHANGE = ("total_steps", "eval_every", "log_every", "checkpoint_every", "steps_per_call",
              "eval.data_dir", "distributed", "num_devices", "model_shards", "seeds_at_once",
              "rl.microbatch_size", "rl.rollout_batch_size", "eval.batch_size", "rl.on_nonfinite", "init_from",
              "sft.steps_per_call", "eval.divergence_every", "model.remat",
              "sft.microbatch_size")
# (`init_from` is read only at a run's start, never by a resume: the same base may be spelled another
# way, relative or absolute, or moved with the workdirs.)
# What every run's config.json holds.
REQUIRED = ("task.name", "protocol.name", "model", "roles", "seed", "num_seeds", "eval.seed", "eval.size")
FILES = ("config.json", "metrics.jsonl", "tensorboard", "checkpoints", checkpoint.WARM_START)


def _get(config: dict, key: str):
  """The value of a dotted `key` in `config`; None where it has none."""
  return functools.reduce(lambda c, part: c.get(part) if isinstance(c, dict) else None, key.split("."), config)


def saved_defaults(group: str, name) -> dict:
  """The settings with a default of the task, workflow or estimator `name` (`config.GROUP`), at their
  defaults as config.json holds them (through JSON: tuples as lists); {} for a name not registered
  (any more)."""
  if group == "protocol":
    defaults = protocols.defaults(name) if name in protocols.REGISTRY else {}
  elif group == "credit":
    defaults = credit.knobs(name) if name in credit.REGISTRY else {}
  else:
    defaults = {f.name: f.default for f in dataclasses.fields(tasks.REGISTRY[name])
                if f.default is not dataclasses.MISSING} if name in tasks.REGISTRY else {}
  return json.loads(json.dumps(defaults, default=repr))


def _with_defaults(config: dict) -> dict:
  """`config` with each setting it omits at its default: experiment files set different subsets of a
  task's or workflow's knobs, and older runs lack settings added since."""
  full = configs.with_new_defaults(ml_collections.ConfigDict(config)).to_dict()
  for group in ("task", "protocol", "credit"):
    full[group] = {**saved_defaults(group, full[group].get("name")), **full[group]}
  return full


def _differences(saved: dict, now: dict, prefix: str) -> list[str]:
  """`KEY: SAVED -> NOW` for each key outside MAY_CHANGE that both hold with different values (a key
  that only one holds is a setting removed since)."""
  out = []
  for key in sorted(set(saved) & set(now)):
    if f"{prefix}{key}" in MAY_CHANGE:
      continue
    if isinstance(saved[key], dict) and isinstance(now[key], dict):
      out += _differences(saved[key], now[key], f"{prefix}{key}.")
    elif saved[key] != now[key]:
      out.append(f"config.{prefix}{key}: {saved[key]!r} there, {now[key]!r} now")
  return out


def check(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses (ValueError) a workdir this run must not write: one it cannot write to, one that
  is a file, one that holds a run's files without their config.json (or with an unreadable one), and
  one whose run had other settings than this one outside MAY_CHANGE.  Reads only."""
  if not workdir:
    raise ValueError("--workdir is empty; give a directory (new or a run's)")
  existing = workdir
  while not os.path.exists(existing):
    existing = os.path.dirname(os.path.abspath(existing))
  if existing != workdir and not os.path.isdir(existing):
    raise ValueError(f"--workdir={workdir} cannot be made: {existing} is a file; give a directory (new or "
                     f"a run's)")
  paths = [existing] + [p for p in (os.path.join(workdir, f) for f in FILES) if os.path.exists(p)]
  for path in paths:
    if not os.access(path, os.W_OK | (os.X_OK if os.path.isdir(path) else 0)):
      raise ValueError(f"--workdir={workdir}: {path} is not writable (read-only file system or "
                        f"permissions); give a workdir this run can write")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir} is a file, not a directory; give a directory (new or a run's)")
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
  if not isinstance(saved, dict) or any(_get(saved, key) is None for key in REQUIRED):
    raise ValueError(f"--workdir={workdir}: its config.json is unreadable or not a marl_jax config "
                      f"({error if saved is None else 'no ' + '/'.join(REQUIRED)}); give a new workdir")
  try:
    differences = _differences(_with_defaults(saved), _with_defaults(json.loads(config.to_json())), "")
  except (TypeError, AttributeError, KeyError) as e:  # a group that is not a group, say {"rl": 5}
    raise ValueError(f"--workdir={workdir}: its config.json is not a marl_jax config ({type(e).__name__}: "
                     f"{e}); give a new workdir") from e
  if differences:
    raise ValueError(f"--workdir={workdir} holds a run of a different config ({'; '.join(differences)}): "
                      f"resuming it needs the same settings but {'/'.join(MAY_CHANGE)}; give a new "
                      f"workdir (--config.init_from={workdir} starts one from its parameters, when they fit)")
