"""A checkpoint's `tokenizer.json` (the `tokenizers` library) and its family's chat layout.

Chat turns are rendered to text and tokenized whole, as transformers' chat templates are, so the
special tokens of the layout come out as their single ids.
"""
import dataclasses
import os

import tokenizers

from marl_jax.lm import checkpoint


@dataclasses.dataclass(frozen=True)
class ChatLayout:
  begin: str  # once, before the first turn
  header: str  # opens a turn; formatted with {role}
  end_of_turn: str  # the special token that closes a turn
  after_turn: str  # text between the end of a turn and the next header


LAYOUTS = {  # by config.json model_type
    "qwen3": ChatLayout("", "<|im_start|>{role}\n", "<|im_end|>", "\n"),
    "llama": ChatLayout("<|begin_of_text|>", "<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>",
                        ""),
}


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  tok: tokenizers.Tokenizer
  layout: ChatLayout
  end_of_turn_id: int

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    """Ids of `text` alone: no BOS or other tokens the tokenizer's post-processor would add."""
    return self.tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids) -> str:
    return self.tok.decode(list(map(int, ids)), skip_special_tokens=False)

  def render_chat(self, turns: list[tuple[str, str]], next_role: str | None = None) -> list[int]:
    """Ids of the (role, text) turns in the chat layout; with `next_role`, followed by the header of
    that role's turn, the prompt from which the model writes it."""
    lay = self.layout
    text = lay.begin + "".join(lay.header.format(role=role) + body + lay.end_of_turn + lay.after_turn
                               for role, body in turns)
    if next_role is not None:
      text += lay.header.format(role=next_role)
    return self.encode(text)


def load(directory: str) -> Tokenizer:
  """The tokenizer of the checkpoint in `directory`, its chat layout chosen by config.json model_type."""
  model_type = checkpoint.read_hf_config(directory).get("model_type")
  if model_type not in LAYOUTS:
    raise ValueError(f"config.json model_type={model_type!r} has no chat layout; allowed: {list(LAYOUTS)}")
  path = os.path.join(directory, "tokenizer.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing")
  try:
    tok = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # the tokenizers library raises a bare Exception for an unreadable file
    raise ValueError(f"{path} is not a readable tokenizer ({e})") from e
  layout = LAYOUTS[model_type]
  # Every special token of the layout must be one token, or rendered turns would not parse as chat.
  for special in special_tokens(layout.begin + layout.header + layout.end_of_turn):
    if tok.token_to_id(special) is None:
      raise ValueError(f"{path} lacks the token {special!r} that the {model_type} chat layout needs")
  return Tokenizer(tok, layout, tok.token_to_id(layout.end_of_turn))


def special_tokens(text: str) -> list[str]:
  """The `<|...|>` tokens in a layout string."""
  return ["<|" + part.split("|>")[0] + "|>" for part in text.split("<|")[1:]]
