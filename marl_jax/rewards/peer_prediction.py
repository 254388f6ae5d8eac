"""Peer-prediction pay: the correlated agreement (CA) mechanism of Shnayder, Agarwal, Frongillo and
Parkes 2016 ("Informed truthfulness in multi-task peer prediction", EC 2016), which generalises
Dasgupta and Ghosh 2013 ("Crowdsourced judgement elicitation with endogenous proficiency", WWW 2013)
from binary reports to many.  It needs no ground truth: two or more judges report on the same answers
(the mechanism's tasks: every judged answer of the batch), and each is paid by how much more its
report agrees with the others' on the same answer than with their reports on other answers (chance
agreement).

With reports x of judge i and y of judge j, Delta_ij(x, y) = P(i says x, j says y of one answer) -
P(i says x) P(j says y), estimated on the batch; the score matrix is S_ij(x, y) = 1 where Delta > 0.
Judge i's pay for answer b is the mean over the other judges j of

  S_ij(r_i(b), r_j(b)) - mean over answers b' != b of S_ij(r_i(b), r_j(b'))

(the paper draws one b'; the mean over all of them is its expectation, with less variance).  Truthful
reports are an equilibrium paying at least any other strategy, and strictly more than any that is
uninformed (e.g. always accepting).  For binary reports that agree more than chance, S is the
identity and this is Dasgupta and Ghosh's mechanism.  Reports are the judges' confidence levels.
Pay is in [-1, 1].
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax.rewards import base


def correlated_agreement(level_JxA, num_levels: int):
  """pay_JxA of the CA mechanism for J >= 2 judges' reports level_JxA (ints below `num_levels`)."""
  J, A = level_JxA.shape
  x_JxAxL = jax.nn.one_hot(level_JxA, num_levels)
  marginal_JxL = x_JxAxL.mean(1)
  joint_JxJxLxL = jnp.einsum("ibx,jby->ijxy", x_JxAxL, x_JxAxL) / A
  delta_JxJxLxL = joint_JxJxLxL - marginal_JxL[:, None, :, None] * marginal_JxL[None, :, None, :]
  score_JxJxLxL = (delta_JxJxLxL > 0).astype(jnp.float32)
  # j's reports on the other answers, as shares: the random-pair baseline's expectation.
  others_JxAxL = (A * marginal_JxL[:, None] - x_JxAxL) / (A - 1)
  bonus_JxJxA = jnp.einsum("ibx,ijxy,jby->ijb", x_JxAxL, score_JxJxLxL, x_JxAxL)
  chance_JxJxA = jnp.einsum("ibx,ijxy,jby->ijb", x_JxAxL, score_JxJxLxL, others_JxAxL)
  others_JxJ = ~np.eye(J, dtype=bool)
  return jnp.einsum("ijb,ij->ib", bonus_JxJxA - chance_JxJxA, others_JxJ) / (J - 1)


@base.register("peer_prediction")
@dataclasses.dataclass(frozen=True)
class PeerPrediction(base.PayRule):
  min_judges = 2
  pays_team_reward = False

  def pay(self, state, reviewed, judged_A):
    return correlated_agreement(reviewed.level_JxA, len(reviewed.levels)), state, {}
