"""One small vocabulary shared by every task, role and protocol.

Tokens are ints; `encode`/`decode` map between them and readable strings.  Ids are stable: new tokens
are appended before the reserved tail, never inserted, so checkpoints stay readable.
"""
import numpy as np

SPECIAL = ["<pad>", "<bos>", "<eos>", "<sep>", "<accept>", "<reject>", "<absent>"]
DIGITS = [str(d) for d in range(10)]
SYMBOLS = ["+", "-", "*", "=", "%", "(", ")", ",", "?", ":"]
ROLE_MARKERS = [f"<role{i}>" for i in range(8)]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB_SIZE = 96

TOKENS = SPECIAL + DIGITS + SYMBOLS + ROLE_MARKERS + LETTERS
TOKENS += [f"<unused{i}>" for i in range(VOCAB_SIZE - len(TOKENS))]
TOKEN_ID = {t: i for i, t in enumerate(TOKENS)}

PAD, BOS, EOS = (TOKEN_ID[t] for t in SPECIAL[:3])
ACCEPT, REJECT, ABSENT = TOKEN_ID["<accept>"], TOKEN_ID["<reject>"], TOKEN_ID["<absent>"]
DIGIT0 = TOKEN_ID["0"]
PLUS, MINUS, TIMES, EQUALS = (TOKEN_ID[s] for s in "+-*=")


def role_marker(role_index: int) -> int:
  return TOKEN_ID[f"<role{role_index}>"]


def encode(text: str) -> list[int]:
  """Encodes a string; `<name>` spans are single tokens, every other character is one token."""
  ids, i = [], 0
  while i < len(text):
    if text[i] == "<":
      j = text.index(">", i) + 1
      ids.append(TOKEN_ID[text[i:j]])
      i = j
    elif text[i] == " ":
      i += 1
    else:
      ids.append(TOKEN_ID[text[i]])
      i += 1
  return ids


def decode(ids, skip_pad: bool = True) -> str:
  return "".join(TOKENS[int(i)] for i in np.asarray(ids).reshape(-1) if not (skip_pad and i == PAD))


def render_transcript(tokens_T, segment_T, names) -> str:
  """One line per segment, `name: tokens`, without role markers and padding.

  `segment_T` and `names` come from the protocol layout (segment names carry the author role, e.g.
  `verifier0`); segments the episode never reached (all padding) are left out.
  """
  tokens_T, segment_T = np.asarray(tokens_T), np.asarray(segment_T)
  lines = []
  for s, name in enumerate(names):
    ids = [int(t) for t in tokens_T[segment_T == s] if t != PAD and not TOKENS[t].startswith("<role")]
    if ids:
      lines.append(f"{name:>12}: {decode(ids)}")
  return "\n".join(lines)
