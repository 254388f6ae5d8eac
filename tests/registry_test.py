import pytest

from marl_jax import credit, losses, protocols, registry, rewards, tasks
from marl_jax.tasks.base import Task


def test_a_name_taken_by_another_definition_is_refused_naming_both():
  table = registry.Registry("thing.name", "thing")

  @table.register("relay")
  def first():
    pass

  def second():
    pass

  with pytest.raises(ValueError, match=r"'relay' is registered twice: registry_test\..*first and "
                                       r"registry_test\..*second; give the new one its own name"):
    table.register("relay")(second)
  assert table == {"relay": first}
  assert table.register("relay")(first) is first  # the same definition again: a module reloaded


def test_every_table_refuses_a_second_definition_under_a_taken_name():
  class Relay(protocols.Protocol):
    pass

  class Arithmetic(Task):
    name = "arithmetic"

  for register, name, entry in ((protocols.register, "relay", Relay), (credit.register, "team", Relay),
                                (rewards.register, "team", Relay), (losses.register, "ppo", Relay)):
    with pytest.raises(ValueError, match=f"'{name}' is registered twice"):
      register(name)(entry)
  with pytest.raises(ValueError, match="'arithmetic' is registered twice"):
    tasks.register(Arithmetic)
  assert protocols.REGISTRY["relay"].__module__ == "marl_jax.protocols.relay"


@pytest.mark.parametrize("table, name, what", [(tasks.REGISTRY, "task.name", "task"),
                                               (protocols.REGISTRY, "protocol.name", "protocol"),
                                               (credit.REGISTRY, "credit.name", "estimator"),
                                               (rewards.REGISTRY, "reward.pay", "payment rule"),
                                               (losses.REGISTRY, "rl.algorithm", "loss")])
def test_every_kind_is_one_registry_naming_its_config_key(table, name, what):
  assert isinstance(table, registry.Registry) and (table.key, table.what) == (name, what)
  with pytest.raises(ValueError, match=rf"config.{name}='nope' is unknown; allowed: \[{sorted(table)[0]!r}"):
    table.lookup("nope")


def test_make_refuses_a_setting_the_entry_does_not_take():
  with pytest.raises(ValueError, match=r"config.credit has keys \['nope'\] that estimator 'team' does not take; "
                                       r"allowed: \["):
    credit.REGISTRY.make("team", nope=1)
  assert credit.REGISTRY.make("team") == credit.make("team")
