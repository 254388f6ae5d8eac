"""sft.demonstration_loss: the cross-entropy of exactly the tokens a role wrote, padding left out."""
import types

import jax.numpy as jnp
import numpy as np
from sampling_test import CFG, _layout, _params, _prompts, _token_log_probs

from marl_jax import sft, text
from marl_jax.protocols import engine


def test_demonstration_loss_averages_role_authored_non_padding_tokens():
  layout = _layout("solver_verifier", (0, 1))
  # prompt 0..4 | solver marker 5, answer 6..7 | verifier marker 8, verdict 9..11
  assert layout.turn_slices == ((6, 8), (9, 12))
  answer_2xA = jnp.array([text.encode("7<eos>"), text.encode("3<eos>")])
  verdict_2xV = jnp.array([text.encode("<accept><eos><pad>"), text.encode("<reject>4<eos>")])
  tokens_2xT = engine.assemble(layout, _prompts()[:2], [answer_2xA, verdict_2xV])
  params_R = _params(2)
  loss = sft.demonstration_loss(types.SimpleNamespace(model=CFG, layout=layout), params_R, tokens_2xT)
  # The policy's teacher-forced log-probs at temperature 1, averaged over the positions written out
  # by hand: both messages, less row 0's padded last verdict slot (9 tokens).
  logp_2xT = np.asarray(_token_log_probs(layout, params_R, tokens_2xT, temperature=1.0)[0])
  authored_2xT = np.zeros((2, layout.length), bool)
  authored_2xT[:, [6, 7, 9, 10, 11]] = True
  authored_2xT[0, 11] = False
  np.testing.assert_allclose(loss, -logp_2xT[authored_2xT].mean(), rtol=1e-5)
  # Not the mean over every non-padding position: the prompt and the role markers are the
  # environment's, not a demonstration to imitate.
  written_2xT = np.array(tokens_2xT != text.PAD)
  written_2xT[:, 0] = False  # the first token has no prediction
  assert not np.isclose(loss, -logp_2xT[written_2xT].mean(), rtol=1e-2)
