"""The name -> class (or function) tables that a config's `name` keys select: tasks, workflows, credit
estimators, payment rules and losses each register into a `Registry` of their own with its
`register` decorator, and are looked up, described and made through it."""
import dataclasses
import importlib
import pkgutil


def _path(entry) -> str:
  return f"{entry.__module__}.{entry.__qualname__}"


class Registry(dict):
  """One kind's table, name -> entry, selected by `config.KEY=name` (`key`, e.g. `task.name`); `what`
  names an entry in messages (`task`, `estimator`)."""

  def __init__(self, key: str, what: str):
    super().__init__()
    self.key, self.what = key, what

  def register(self, name: str):
    """`@register("NAME")` puts what it decorates in the table under NAME.  A second entry under a
    taken name is refused (a copied file that kept its model's name would otherwise replace that model
    silently); the same definition again (a module reloaded) is not."""
    def add(entry):
      if name in self and _path(self[name]) != _path(entry):
        raise ValueError(f"{name!r} is registered twice: {_path(self[name])} and {_path(entry)}; "
                         "give the new one its own name")
      self[name] = entry
      return entry
    return add

  def lookup(self, name: str):
    """The entry that `config.KEY=name` selects; a ValueError naming the allowed ones."""
    if name not in self:
      raise ValueError(f"config.{self.key}={name!r} is unknown; allowed: {sorted(self)}")
    return self[name]

  def settings(self, name: str) -> dict:
    """The settings of a dataclass entry (its fields) and their defaults."""
    return {f.name: f.default for f in dataclasses.fields(self.lookup(name))}

  def refuse_unknown(self, name: str, kwargs: dict, allowed) -> None:
    """A ValueError when `kwargs` holds a key that entry `name` does not take, naming the config group
    (`key`'s), the entry and what it allows."""
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
      raise ValueError(f"config.{self.key.rpartition('.')[0]} has keys {unknown} that {self.what} {name!r} does "
                       f"not take; allowed: {sorted(allowed)}")

  def make(self, name: str, **kwargs):
    """The dataclass entry `name` with settings `kwargs` (`refuse_unknown` against its settings)."""
    self.refuse_unknown(name, kwargs, self.settings(name))
    return self[name](**kwargs)


def import_modules(package: str, path) -> None:
  """Imports every module of `package` (its `__name__` and `__path__`), so each registers its entry by
  existing: a new estimator, task or workflow is one file."""
  for module in pkgutil.iter_modules(path):
    importlib.import_module(f"{package}.{module.name}")
