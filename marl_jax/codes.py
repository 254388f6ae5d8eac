"""Measures of the code a sender's messages use for the objects it sees (the signalling game's), on a
batch of B (object, message) pairs: pure jax, pairwise over the batch (O(B^2)), so they run inside
the step and the evaluation.

- `topographic_similarity`: the Spearman correlation between the pairwise Hamming distances of the
  objects and those of their messages (Brighton & Kirby 2006, as Li & Bowling 2019, arXiv 1906.02403,
  and Ren et al. 2020, arXiv 2002.01365, report it): 1 for a code that changes one symbol per changed
  attribute, about 0 for a random one.
- `mutual_information`: I(object; message) in bits, the plug-in estimate from the batch's joint counts:
  H(object) for a code that tells every object apart, 0 for a message that ignores the object.
- `agreement`: the share of rows on which two codes write the same message (a newcomer's or the
  next generation's against the team's).

Messages are compared token by token over their slot as the sampler writes them (PAD after the first
EOS: `tasks.base.canonical` gives a hand-written one that form), so two messages of different lengths
differ where one has ended.
"""
import jax.numpy as jnp
import numpy as np


def hamming_BxB(x_BxN):
  """Pairwise Hamming distances between the rows of x_BxN."""
  return jnp.sum(x_BxN[:, None] != x_BxN[None], -1)


def average_ranks(x_P):
  """1-based ranks of x_P, ties given their average rank (as scipy.stats.rankdata's default)."""
  sorted_P = jnp.sort(x_P)
  below_P = jnp.searchsorted(sorted_P, x_P, side="left")
  at_most_P = jnp.searchsorted(sorted_P, x_P, side="right")
  return (below_P + at_most_P + 1) / 2


def spearman(x_P, y_P):
  """Rank correlation with average ranks for ties; 0 where either side is constant (a code that
  writes one message for every object has no structure to correlate)."""
  rx_P, ry_P = average_ranks(x_P), average_ranks(y_P)
  dx_P, dy_P = rx_P - rx_P.mean(), ry_P - ry_P.mean()
  # Tested on the values: the ranks of a constant are equal, but their centred rounding is not 0.
  varies = (jnp.ptp(x_P) > 0) & (jnp.ptp(y_P) > 0)
  norm = jnp.sqrt(jnp.sum(dx_P**2) * jnp.sum(dy_P**2))
  return jnp.where(varies, jnp.sum(dx_P * dy_P) / jnp.where(varies, norm, 1.0), 0.0)


def topographic_similarity(object_BxK, message_BxL):
  """Spearman correlation of the objects' and the messages' pairwise Hamming distances, over the
  B (B - 1) / 2 pairs of rows."""
  i, j = np.triu_indices(object_BxK.shape[0], k=1)
  return spearman(hamming_BxB(object_BxK)[i, j], hamming_BxB(message_BxL)[i, j])


def _entropy_bits(same_BxB, among_B):
  """The plug-in entropy (bits) of a variable whose rows are equal where same_BxB, over the rows
  `among_B`: each weighs 1/n, and a row's value has the probability of those rows equal to it."""
  n = among_B.sum()
  log_p_B = jnp.log2(jnp.maximum((same_BxB & among_B[None]).sum(1), 1) / n)
  return -jnp.sum(jnp.where(among_B, log_p_B, 0.0)) / n


def mutual_information(object_BxK, message_BxL, among_B=None):
  """I(object; message) = H(object) + H(message) - H(object, message), in bits, from the batch's rows
  (or those `among_B`: NaN when there is none)."""
  among_B = jnp.ones(object_BxK.shape[0], bool) if among_B is None else among_B
  same_object_BxB = hamming_BxB(object_BxK) == 0
  same_message_BxB = hamming_BxB(message_BxL) == 0
  return (_entropy_bits(same_object_BxB, among_B) + _entropy_bits(same_message_BxB, among_B)
          - _entropy_bits(same_object_BxB & same_message_BxB, among_B))


def agreement(message_BxL, other_BxL):
  """The share of rows where two codes write the same message."""
  return jnp.mean(jnp.all(message_BxL == other_BxL, -1))

