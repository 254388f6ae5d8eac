"""Credit assignment: who is rewarded for a shared outcome, and by how much.

`config.credit.name` selects an estimator; the other `config.credit` keys are its settings.  One file
per estimator (see `base.py` for the interface)::

  team:          every role gets the group-baseline advantage of the team outcome.
  per_role:      each role gets the group-baseline advantage of its own verifiable signal.
  difference:    outcome advantage + counterfactual credit D_r = R - mean_K R(role r's messages
                 re-drawn or absent, the turns that can react re-sampled, everything else fixed).
  role_baseline: the role's reward minus a moving average of it (a stateful estimator).
  role_normalized: the group-baseline advantage of the team outcome (or the role's own signal),
                 standardised per role over the global batch.
  shapley:       outcome advantage + Shapley credit phi_r in the game v(S) = team outcome with the
                 roles outside S absent; exact over 2^R coalitions, Monte Carlo over orders above a limit.
  critic:        outcome advantage + COMA credit A_r = Q(z) - mean_K Q(role r's messages re-drawn, the
                 other turns as they were), Q a learned centralised critic (a stateful estimator).

The pure `shapley_values(value_fn, n)` and `difference_rewards(value_fn, n)` work on any game.
"""
from marl_jax import registry
from marl_jax.credit.base import REGISTRY, Counterfactuals, Estimator, Outcome, Reruns, register
from marl_jax.credit.baselines import BASELINES, group_advantage
from marl_jax.credit.difference import difference_credit, difference_rewards
from marl_jax.credit.shapley import (coalitions, prefix_coalitions, shapley_from_permutations,
                                     shapley_from_values, shapley_values)

registry.import_modules(__name__, __path__)


def knobs(name: str) -> dict:
  """An estimator's settings and their defaults."""
  return REGISTRY.settings(name)


def make(name: str, **kwargs) -> Estimator:
  return REGISTRY.make(name, **kwargs)
