"""The name -> class (or function) tables that a config's `name` keys select: credit estimators,
losses and workflows register into theirs with a decorator."""


def registrar(table: dict):
  """`register` for `table`: `@register("NAME")` puts what it decorates in `table` under NAME."""
  def register(name: str):
    def add(entry):
      table[name] = entry
      return entry
    return add
  return register
