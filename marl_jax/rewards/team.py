"""Team pay: every judge shares the judged roles' reward, the team's (what a workflow's judge gets
under the checker's team reward).  The baseline, and open to collusion: a judge that accepts
everything raises its own pay with the solver's wherever nothing is audited."""
import dataclasses

import jax.numpy as jnp

from marl_jax.rewards import base


@base.register("team")
@dataclasses.dataclass(frozen=True)
class Team(base.PayRule):

  def pay(self, state, reviewed, judged_A):
    return jnp.broadcast_to(judged_A, reviewed.level_JxA.shape), state, {}
