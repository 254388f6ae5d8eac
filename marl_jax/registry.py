"""The name -> class (or function) tables that a config's `name` keys select: credit estimators,
losses, tasks and workflows register into theirs with a decorator."""
import dataclasses
import importlib
import pkgutil


def _path(entry) -> str:
  return f"{entry.__module__}.{entry.__qualname__}"


def registrar(table: dict):
  """`register` for `table`: `@register("NAME")` puts what it decorates in `table` under NAME.  A
  second entry under a taken name is refused (a copied file that kept its model's name would
  otherwise replace that model silently); the same definition again (a module reloaded) is not."""
  def register(name: str):
    def add(entry):
      if name in table and _path(table[name]) != _path(entry):
        raise ValueError(f"{name!r} is registered twice: {_path(table[name])} and {_path(entry)}; "
                         "give the new one its own name")
      table[name] = entry
      return entry
    return add
  return register


def import_modules(package: str, path) -> None:
  """Imports every module of `package` (its `__name__` and `__path__`), so each registers its entry by
  existing: a new estimator, task or workflow is one file."""
  for module in pkgutil.iter_modules(path):
    importlib.import_module(f"{package}.{module.name}")


def lookup(table: dict, key: str, name: str):
  """The entry of `table` that `config.KEY=name` selects; a ValueError naming the allowed ones."""
  if name not in table:
    raise ValueError(f"config.{key}={name!r} is unknown; allowed: {sorted(table)}")
  return table[name]


def settings(table: dict, key: str, name: str) -> dict:
  """The settings of a dataclass entry (its fields) and their defaults."""
  return {f.name: f.default for f in dataclasses.fields(lookup(table, key, name))}


def make(table: dict, key: str, name: str, what: str, **kwargs):
  """The dataclass entry `name` with settings `kwargs`; a key it does not take is refused, naming the
  config group (`key`'s) and the `what` (estimator, payment rule) and its settings."""
  allowed = settings(table, key, name)
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f"config.{key.rpartition('.')[0]} has keys {unknown} that {what} {name!r} does not take; "
                     f"allowed: {sorted(allowed)}")
  return table[name](**kwargs)
