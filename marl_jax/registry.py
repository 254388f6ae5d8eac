"""The name -> class (or function) tables that a config's `name` keys select: credit estimators,
losses, tasks and workflows register into theirs with a decorator."""
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
