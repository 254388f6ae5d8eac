import pytest

from marl_jax import credit, losses, protocols, registry, tasks


def test_a_name_taken_by_another_definition_is_refused_naming_both():
  table = {}
  register = registry.registrar(table)

  @register("relay")
  def first():
    pass

  def second():
    pass

  with pytest.raises(ValueError, match=r"'relay' is registered twice: registry_test\..*first and "
                                       r"registry_test\..*second; give the new one its own name"):
    register("relay")(second)
  assert table == {"relay": first}
  assert register("relay")(first) is first  # the same definition again: a module reloaded


def test_every_table_refuses_a_second_definition_under_a_taken_name():
  class Relay(protocols.Protocol):
    pass

  class Arithmetic(tasks.Task):
    name = "arithmetic"

  for register, name, entry in ((protocols.register, "relay", Relay), (credit.register, "team", Relay),
                                (losses.register, "ppo", Relay)):
    with pytest.raises(ValueError, match=f"'{name}' is registered twice"):
      register(name)(entry)
  with pytest.raises(ValueError, match="'arithmetic' is registered twice"):
    tasks.register(Arithmetic)
  assert protocols.REGISTRY["relay"].__module__ == "marl_jax.protocols.relay"
