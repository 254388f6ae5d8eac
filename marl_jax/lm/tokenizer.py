"""A checkpoint's `tokenizer.json` (the `tokenizers` library) and the chat layout its tokenizer files use.

Chat turns are rendered to text and tokenized whole, as transformers' chat templates are, so the
special tokens of the layout come out as their single ids.  The layout is the tokenizer's, not the
architecture's: a Llama-architecture checkpoint may speak ChatML (as SmolLM's do), a Qwen3 one Llama-3's
turns; `choose_layout` reads it from the special tokens and the chat template.
"""
import dataclasses
import os

import tokenizers

from marl_jax import files


@dataclasses.dataclass(frozen=True)
class ChatLayout:
  begin: str  # once, before the first turn
  header: str  # opens a turn; formatted with {role}
  end_of_turn: str  # the special token that closes a turn
  after_turn: str  # text between the end of a turn and the next header


LAYOUTS = {
    # Qwen, SmolLM and many others.
    "chatml": ChatLayout("", "<|im_start|>{role}\n", "<|im_end|>", "\n"),
    # Llama 3.x.
    "llama3": ChatLayout("<|begin_of_text|>", "<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>",
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
  """The tokenizer of the checkpoint in `directory`, in the chat layout its tokenizer files use
  (`choose_layout` of its special tokens and chat template)."""
  path = os.path.join(directory, "tokenizer.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing")
  try:
    tok = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # the tokenizers library raises a bare Exception for an unreadable file
    raise ValueError(f"{path} is not a readable tokenizer ({e})") from e
  # A layout's special token counts only as one token: split in pieces, rendered turns would not parse
  # as chat.
  tokens = {special for layout in LAYOUTS.values() for special in needed_tokens(layout)
            if tok.encode(special, add_special_tokens=False).ids == [tok.token_to_id(special)]}
  chat_template = read_chat_template(directory)
  try:
    layout = LAYOUTS[choose_layout(tokens, chat_template)]
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from e
  return Tokenizer(tok, layout, tok.token_to_id(layout.end_of_turn))


def choose_layout(tokens: set[str], chat_template: str | None) -> str:
  """The name (in `LAYOUTS`) of the chat layout of a tokenizer that holds `tokens` as single tokens and
  has `chat_template` (None when it has none).

  A layout fits the tokenizer when it holds every special token the layout writes.  When the chat
  template writes the turn tokens of some layout (`<|im_start|>`: chatml, `<|start_header_id|>`:
  llama3), the template decides: the layout is the one it writes, and it must fit.  Otherwise (no
  template, or one written in none of the known layouts) the tokens decide: the one layout that fits.
  So a tokenizer holding the tokens of both layouts takes its template's.  Anything else is a
  ValueError naming the known layouts, the tokens each needs and those the tokenizer lacks.
  """
  fitting = [name for name, layout in LAYOUTS.items() if set(needed_tokens(layout)) <= tokens]
  written = [name for name, layout in LAYOUTS.items()
             if chat_template and all(t in chat_template for t in turn_tokens(layout))]
  chosen = [name for name in fitting if name in written] if written else fitting
  if len(chosen) == 1:
    return chosen[0]
  if chosen:
    reason = f"it holds the tokens of the layouts {chosen} and no chat template singles one out"
  elif written:
    reason = f"its chat template writes the {' and '.join(written)} layout, which it lacks tokens of"
  else:
    reason = "it holds the tokens of no known chat layout"
  known = "; ".join(
      f"{name} needs {needed_tokens(layout)}"
      + (f" (lacks {[t for t in needed_tokens(layout) if t not in tokens]})" if name not in fitting else "")
      for name, layout in LAYOUTS.items())
  raise ValueError(f"{reason}; known layouts and the tokens each needs: {known}")


def needed_tokens(layout: ChatLayout) -> list[str]:
  """The special tokens a layout writes, each of which the tokenizer must hold as one token."""
  return special_tokens(layout.begin + layout.header + layout.end_of_turn)


def turn_tokens(layout: ChatLayout) -> list[str]:
  """The special tokens of a layout's turns: those a chat template writes out (templates write the
  `begin` token, if any, as a variable: `{{ bos_token }}`)."""
  return special_tokens(layout.header + layout.end_of_turn)


def special_tokens(text: str) -> list[str]:
  """The `<|...|>` tokens in a layout string."""
  return ["<|" + part.split("|>")[0] + "|>" for part in text.split("<|")[1:]]


def read_chat_template(directory: str) -> str | None:
  """The checkpoint's chat template, where transformers writes it: `chat_template.jinja` (newer
  versions), else `chat_template` in `tokenizer_config.json`; None when it has neither.  A list of
  named templates (a default and, say, a tool-use one) is read as all of them: they share one layout."""
  jinja = os.path.join(directory, "chat_template.jinja")
  if os.path.isfile(jinja):
    with open(jinja, encoding="utf-8") as f:
      return f.read()
  config_path = os.path.join(directory, "tokenizer_config.json")
  if not os.path.isfile(config_path):
    return None
  tokenizer_config = files.read_json(config_path)
  if not isinstance(tokenizer_config, dict):
    raise ValueError(f"{config_path} is a JSON {type(tokenizer_config).__name__}; allowed: a JSON object")
  template = tokenizer_config.get("chat_template")
  if template is None or isinstance(template, str):
    return template
  if isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str)
                                        for t in template):
    return "\n".join(t["template"] for t in template)
  raise ValueError(f"{config_path} chat_template is {type(template).__name__}; allowed: a string or a list "
                   "of {'name': ..., 'template': string}")
