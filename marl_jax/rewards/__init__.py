"""Rewards: where the judged roles' outcome reward comes from, and how judges are paid.

`config.reward.source` is `checker` (the task's exact checker, the default) or `peer` (the judging
roles' verdicts, with the checker only on audited episodes); `config.reward.pay` selects a payment rule
and the other `config.reward` keys are its settings.  One file per rule (see `base.py` for the
interface and the stage)::

  team:            every judge shares the judged roles' reward.
  audited:         a judge is paid the Brier score of its stated confidence on audited episodes.
  audited_team:    that on audited episodes, and a share of the judged roles' reward elsewhere.
  audited_balanced: the Brier score on audited episodes, right and wrong answers weighted equally.
  peer_prediction: a judge is paid by correlated agreement with the other judges (no ground truth).
  reputation:      the judges' verdicts are weighted by their audited track records (a Beta posterior).
"""
from marl_jax import registry
from marl_jax.rewards.base import (JUDGE_LOSSES, PLANT_STREAM, REGISTRY, REPLAY_STREAM, SOURCES, VERDICTS, Labels, PayRule,
                                   Plants, Reviewed, assign, audit_keys, check, check_rotation, draw_audits,
                                   draw_plants, evaluation, labels, register, rotate_judges, settle)

registry.import_modules(__name__, __path__)


def knobs(pay: str) -> dict:
  """A payment rule's settings, the shared ones (source, audit_rate, penalty) first, and their defaults."""
  return REGISTRY.settings(pay)


def make(pay: str, **kwargs) -> PayRule:
  return REGISTRY.make(pay, **kwargs)
