"""A local Hugging Face-format checkpoint as a marl_jax agent: tasks, workflows, credit estimators and
the jitted step run on it unchanged (`--config.model.checkpoint=DIR`).

The engine writes every canvas in its own symbol vocabulary (`marl_jax.text`: digits, operators,
letters, `<eos>`, role markers, ...).  An `LMAgent` maps each symbol to one token of the checkpoint's
tokenizer on the way in and, on the way out, applies only those tokens' unembedding rows, so the policy
is the language model restricted to the task's alphabet: what it may write is exactly what the task can
read, with the model's own end-of-turn token closing every message.  Roles stay engine-assigned: each
role marker is a token the policy can never write (`sampling.policy_log_probs` masks it).

A free-text task (`tasks.word_problems.WordProblems`) needs the whole vocabulary: with `free_text` the canvas values
are the 96 engine symbols followed by every other ordinary token of the tokenizer (`canvas_ids`), so
the policy is the whole language model (its special tokens aside) and the engine still reads its own
symbols (EOS, digits, accept/reject) where it needs them.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marl_jax import model as model_lib
from marl_jax import text
from marl_jax.lm import hf_checkpoint
from marl_jax.lm import lora as lora_lib
from marl_jax.lm import model as lm_model
from marl_jax.lm import tokenizer as lm_tokenizer

# A rollout's KV cache on CPU, in blocks of this many canvas positions: a decode step skips the blocks
# not written yet.  At Qwen3-0.6B's widths (batch 32) one block's q.k and weighing cost ~0.3 ms a layer
# against ~4.3 ms for a 384-position canvas in one buffer, so blocks far smaller cost more in their
# `lax.cond`s than they save.
CPU_CACHE_BLOCK = 64

# The text each special symbol is written as, first choice first: the first that the tokenizer encodes
# as a single token is taken.  Role k's marker is the letter "A" + k, the name of a speaker in a
# transcript.  Padding and the reserved symbols are never read (masked keys) nor written.
SPECIAL_TEXT = {"<sep>": ("\n", ";"), "<accept>": ("yes", " yes", "Y"), "<reject>": ("no", " no", "N"),
                "<absent>": ("_", "~")}
SPECIAL_TEXT.update({text.TOKENS[text.role_marker(k)]: (chr(ord("A") + k),)
                     for k in range(len(text.ROLE_MARKERS))})
# In free text a policy may write any character, so role markers and `<absent>` (symbols no policy
# writes: sampling masks them) are control characters instead (0x10 + k, and 0x1A, "substitute"; never
# in text, and byte-level tokenizers hold each as one token), the printable text only where one is not.
# As "_", `<absent>` banned the underscore from every message and scored a demonstration holding one
# at log-prob -1e9.
FREE_TEXT = dict(SPECIAL_TEXT)
FREE_TEXT.update({text.TOKENS[text.role_marker(k)]: (chr(0x10 + k), chr(ord("A") + k))
                  for k in range(len(text.ROLE_MARKERS))})
FREE_TEXT["<absent>"] = (chr(0x1A), *SPECIAL_TEXT["<absent>"])


def symbol_ids(tok: lm_tokenizer.Tokenizer, free_text: bool = False) -> tuple[int, ...]:
  """The tokenizer's id of every engine symbol, ids_V (V = text.VOCAB_SIZE).

  `<eos>` is the end-of-turn token and `<bos>` the first special token of the chat layout (ChatML's
  `<|im_start|>`, Llama-3's `<|begin_of_text|>`); single characters are their own token; the rest
  follow `SPECIAL_TEXT`.  A symbol with no single-token text, or two readable symbols on one token, is
  an error naming the symbol."""
  bos = lm_tokenizer.special_tokens(tok.layout.begin + tok.layout.header)[0]
  texts = FREE_TEXT if free_text else SPECIAL_TEXT
  ids, readable = [], {}
  for symbol in text.TOKENS:
    if symbol in ("<pad>", "<eos>") or symbol.startswith("<unused"):
      ids.append(tok.end_of_turn_id)
      continue
    choices = ((bos,) if symbol == "<bos>" else texts.get(symbol, (symbol,)))
    single = [tok.encode(c) for c in choices]
    single = [e[0] for e in single if len(e) == 1]
    if not single:
      raise ValueError(f"symbol {symbol!r}: none of its texts {list(choices)} is a single token of this "
                       f"tokenizer, so the engine cannot write it")
    if single[0] in readable or single[0] == tok.end_of_turn_id:
      raise ValueError(f"symbols {readable.get(single[0], '<eos>')!r} and {symbol!r} are both token "
                       f"{single[0]} of this tokenizer")
    readable[single[0]] = symbol
    ids.append(single[0])
  return tuple(ids)


def canvas_ids(tok: lm_tokenizer.Tokenizer, vocab_size: int) -> tuple[tuple[int, ...], int]:
  """The tokenizer id of every canvas value of free text, ids_W, and how many of them a policy may
  write: the engine symbols (`symbol_ids(tok, free_text=True)`), then every other ordinary token
  below the model's `vocab_size` (id order), then the special tokens not among the symbols (such as
  Llama's `<|start_header_id|>`), which a prompt may hold but a policy never writes."""
  symbols = symbol_ids(tok, free_text=True)
  special = [i for i, added in sorted(tok.tok.get_added_tokens_decoder().items())
             if added.special and i < vocab_size and i not in symbols]
  taken = set(symbols) | set(special)
  ordinary = tuple(i for i in range(min(vocab_size, tok.vocab_size)) if i not in taken)
  return symbols + ordinary + tuple(special), len(symbols) + len(ordinary)


def free_text_canvas(directory: str) -> tuple[lm_tokenizer.Tokenizer, np.ndarray]:
  """A checkpoint directory's tokenizer and the tokenizer id of each of its free-text canvas values
  (`canvas_ids`), from `tokenizer.json` and `config.json` alone (no weights are read).  The directory
  is always the run's `config.model.checkpoint`, and a free-text task reads it before any agent is
  built: its problems are errors naming that key, as in `from_config`, and a config.json the decoder
  would refuse is refused here too (a missing `vocab_size` named, not a KeyError)."""
  try:
    tok = _load_tokenizer(directory)
    vocab_size = lm_model.LMConfig.from_hf_config(hf_checkpoint.read_hf_config(directory)).vocab_size
  except (OSError, ValueError) as e:
    raise ValueError(f"config.model.checkpoint={directory!r}: {e}") from e
  return tok, np.asarray(canvas_ids(tok, vocab_size)[0])


def decode(tok: lm_tokenizer.Tokenizer, canvas_ids_W, values) -> str:
  """The text of canvas values (padding left out) through the tokenizer, `canvas_ids_W` their ids."""
  values = np.asarray(values).reshape(-1)
  return tok.decode(np.asarray(canvas_ids_W)[values[values != text.PAD]])


@dataclasses.dataclass(frozen=True)
class LMAgent(model_lib.SetStack):
  """The agent-model interface of `marl_jax.model.ModelConfig` (`apply`, `empty_cache`, `init_stack`,
  `pretrained_stack`, `trainable`, `set_axes`, `flops_per_token`, `max_len`) for a Qwen3/Llama
  checkpoint.

  With `lora`, the parameter sets are {"base": the decoder's parameters, "adapter": low-rank adapters
  stacked over the sets} (`lm.lora`): one frozen base that every set shares (`set_axes`: not stacked,
  so a team holds one copy, not one per set), read through `stop_gradient` and given no optimiser
  state by `trainable`, so only adapters learn; every set starts from fresh adapters (b = 0, the
  base's function)."""
  lm: lm_model.LMConfig
  checkpoint: str  # the directory the weights and tokenizer come from
  random_weights: bool  # the checkpoint's shapes, randomly initialised (speed measurements)
  canvas_ids_V: tuple[int, ...]  # the tokenizer id of each canvas value: symbols (then free text)
  lora: lora_lib.LoRAConfig | None = None
  num_writable: int = 0  # free text: canvas values past this are special tokens no policy writes
  # Canvas positions per block of a rollout's KV cache (`empty_cache`); None: the backend's default.
  cache_block: int | None = None

  @property
  def max_len(self) -> int:
    return self.lm.max_len

  @property
  def compute_dtype(self):
    return self.lm.dtype

  @property
  def vocab_size(self) -> int:
    """Canvas values the policy reads and writes: text.VOCAB_SIZE, or more with free text."""
    return len(self.canvas_ids_V)

  def apply(self, params, tokens_BxL, start, key_ok_BxT, cache=None, readout_M=None, positions_L=None):
    """Logits over the canvas values, logits_BxLxV (logits_BxMxV at the positions `readout_M` alone,
    the only ones unembedded), and the updated cache; `positions_L` as `model.apply`'s."""
    ids_V = jnp.asarray(self.canvas_ids_V)
    decoder = lambda variables: lm_model.Decoder(self.lm).apply(
        variables, ids_V[tokens_BxL], start, key_ok_BxT, cache, features=True, readout_M=readout_M,
        positions_L=positions_L)
    if self.lora is None:
      base = params
      x_BxLxD, cache = decoder(lm_model.variables(base))
    else:
      base = jax.lax.stop_gradient(params["base"])
      with lora_lib.adapted(self.lora):
        x_BxLxD, cache = decoder(lm_model.variables(base, params["adapter"]))
    unembed_DxW = (base["embed_tokens"]["embedding"].T if self.lm.tie_word_embeddings
                   else base["lm_head"]["kernel"])
    dtype = self.lm.dtype
    if self.vocab_size > text.VOCAB_SIZE:  # free text: every token's logit, then in canvas order
      logits_BxLxW = jnp.dot(x_BxLxD.astype(dtype), unembed_DxW.astype(dtype))[..., ids_V]
      writable_W = np.arange(self.vocab_size) < self.num_writable
      return jnp.where(writable_W, logits_BxLxW.astype(jnp.float32), -1e9), cache
    # Only the symbols' rows: gathering 96 rows is cheaper than the whole unembedding.
    return jnp.dot(x_BxLxD.astype(dtype), unembed_DxW[:, ids_V].astype(dtype)).astype(jnp.float32), cache

  def empty_cache(self, batch: int, length: int, visible_T=None):
    """In blocks of `cache_block` positions, by default `CPU_CACHE_BLOCK` on CPU, so that a decode step
    reads the keys written so far rather than the whole canvas's (`lm.model.attend`), and one block
    elsewhere: each block's `lax.cond` may make a GPU wait on its predicate (not measured there;
    `python -m marl_jax.tools.lm_bench --cache_block` measures it).  Only the blocks holding a position of
    `visible_T` (the view's) are kept."""
    block = self.cache_block or (CPU_CACHE_BLOCK if jax.default_backend() == "cpu" else None)
    return lm_model.empty_cache(self.lm, batch, length, block, visible_T)

  def rollout_params(self, params):
    """One parameter set cast as every model's (`SetStack.rollout_params`) and, on CPU, its layers'
    kernels one buffer per layer (`lm.model.split_kernels`: one copy per rollout, so that its tokens
    read the weights in place rather than slice them every token); with LoRA the shared base's, the
    role's adapters as they are.  Only on CPU, where it was measured: on a GPU the slices cost little
    at its bandwidth, and each projection's `lax.switch` over the layers may wait on its index."""
    params = super().rollout_params(params)
    if jax.default_backend() != "cpu":
      return params
    if self.lora is None:
      return lm_model.split_kernels(params)
    return {**params, "base": lm_model.split_kernels(params["base"])}

  def init_stack(self, key, n_sets: int):
    if self.lora is None:
      return lm_model.init_stack(self.lm, key, n_sets)
    return self._with_adapters(jax.tree.map(lambda p: p[0], lm_model.init_stack(self.lm, key, 1)), n_sets)

  def pretrained_stack(self, n_sets: int):
    """The checkpoint's parameters as `n_sets` stacked copies (numpy, float32; with LoRA one shared
    base and fresh adapters), or None with `random_weights`: every set starts from the checkpoint."""
    if self.random_weights:
      return None
    params = _load_params(self.checkpoint, self.lm.max_len)
    if self.lora is not None:
      return jax.tree.map(np.asarray, self._with_adapters(params, n_sets))
    return jax.tree.map(lambda p: np.asarray(np.broadcast_to(p, (n_sets,) + p.shape)), params)

  def _with_adapters(self, base, n_sets: int):
    # A fixed key: b = 0 makes every adapter the base's function whatever a is.
    adapter_R = lora_lib.init_adapters(jax.random.key(0), self.lm, self.lora, base, n_sets)
    return {"base": base, "adapter": adapter_R}

  def set_axes(self, params_R):
    """The sets' axis of params_R (a `jax.vmap` in_axes prefix): a LoRA base is shared, not stacked."""
    del params_R
    return 0 if self.lora is None else {"base": None, "adapter": 0}

  def trainable(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` on the trained parameters; with LoRA the base gets no update and no optimiser state."""
    if self.lora is None:
      return tx
    labels = lambda params: {"base": jax.tree.map(lambda _: "frozen", params["base"]),
                             "adapter": jax.tree.map(lambda _: "train", params["adapter"])}
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)

  def servable(self, params):
    """One parameter set as the plain decoder's parameters (LoRA merged in), for `lm.hf_checkpoint.save`."""
    if self.lora is None:
      return params
    return jax.tree.map(np.asarray, lora_lib.merged_params(self.lora, params["base"], params["adapter"]))

  def flops_per_token(self, context_len: int) -> int:
    """As `lm.model.flops_per_token`, with the unembedding of the symbols only (and without the
    adapters' rank x (in + out) multiply-adds per target: a few percent at rank 8)."""
    unembedded = self.lm.vocab_size if self.vocab_size > text.VOCAB_SIZE else self.vocab_size
    return lm_model.flops_per_token(dataclasses.replace(self.lm, vocab_size=unembedded), context_len)


@functools.lru_cache(maxsize=2)
def _load_tokenizer(directory: str) -> lm_tokenizer.Tokenizer:
  return lm_tokenizer.load(directory)


@functools.lru_cache(maxsize=2)
def _load_params(directory: str, max_len: int):
  return hf_checkpoint.load(directory, max_len=max_len)[1]


def from_config(model_config, free_text: bool = False, key: str = "config.model") -> LMAgent:
  """An `LMAgent` from `config.model` (`checkpoint`, `random_weights`, `max_len`, `dtype`, `remat`, `lora`),
  over the whole vocabulary with `free_text`; every file and shape problem is an error naming
  `config.model.checkpoint` (`key`.checkpoint), before anything is compiled."""
  directory = model_config.checkpoint
  try:
    lm = lm_model.LMConfig.from_hf_config(hf_checkpoint.read_hf_config(directory),
                                          max_len=model_config.max_len,
                                          dtype=model_lib.compute_dtype(model_config.dtype),
                                          remat=model_config.get("remat", False))
    tok = lm_tokenizer.load(directory)
    ids_V, num_writable = canvas_ids(tok, lm.vocab_size) if free_text else (symbol_ids(tok), 0)
    if not model_config.random_weights:
      _load_params(directory, lm.max_len)  # a missing or mis-shaped tensor fails here, not in the step
  except (OSError, ValueError) as e:
    raise ValueError(f"{key}.checkpoint={directory!r}: {e}") from e
  if max(ids_V) >= lm.vocab_size:
    raise ValueError(f"{key}.checkpoint={directory!r}: its tokenizer gives token {max(ids_V)}, "
                     f"beyond the model's vocab_size={lm.vocab_size}")
  return LMAgent(lm, directory, model_config.random_weights, ids_V,
                 lora_config(model_config.lora, key), num_writable)


def lora_config(lora, key: str = "config.model") -> lora_lib.LoRAConfig | None:
  """`key.lora` -> LoRAConfig, or None when not `enabled`; bad values name their key (a mixed team's
  `config.models.NAME.lora.rank`, not `config.model`'s)."""
  if not lora.enabled:
    return None
  try:
    return lora_lib.LoRAConfig(rank=lora.rank, alpha=float(lora.alpha), targets=lora.targets)
  except ValueError as e:  # LoRAConfig names `lora.rank`, `lora.alpha` or `lora.targets`
    raise ValueError(f"{key}.{e}") from e
