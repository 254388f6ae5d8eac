"""Local Hugging Face-format checkpoints <-> (LMConfig, params): `config.json` and `model.safetensors`
(or `model.safetensors.index.json` and its shards), read with numpy, no torch.

Every parameter of the Flax tree has one checkpoint tensor, or one per layer for the layers'
parameters, which the decoder stacks on a leading layer axis (`tensor_names`); HF stores a linear layer
as weight[out, in], Flax as kernel[in..., out...], so kernels are transposed (and the attention heads
split out).  Tensors the model does not use (e.g. a copy of tied embeddings as `lm_head.weight`) are
ignored; a missing tensor or one of the wrong shape or dtype is an error naming it, before any data is
read, and so is a file safetensors cannot read (a truncated download, a Git LFS pointer).
"""
import contextlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from marl_jax import files
from marl_jax.lm import model as lm_model

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# Stored dtypes whose values are the weights; quantised ones (int8, float8, packed 4-bit) need scales.
WEIGHT_DTYPES = ("F64", "F32", "BF16", "F16")


def read_hf_config(directory: str) -> dict:
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"checkpoint directory {directory!r} does not exist")
  path = os.path.join(directory, CONFIG)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing: a checkpoint directory holds {CONFIG} and {WEIGHTS} "
                            f"(or {INDEX} and its shards)")
  return files.read_json(path)


@contextlib.contextmanager
def _reading(path: str):
  """safetensors' own errors (a plain Exception subclass) as a ValueError naming the file."""
  try:
    yield
  except SafetensorError as e:
    raise ValueError(f"{path} is not a readable safetensors file ({e}): a truncated download or a Git LFS "
                     "pointer reads so") from e


def tensor_names(cfg: lm_model.LMConfig) -> dict[tuple[str, ...], tuple[tuple[str, ...], tuple[int, ...]]]:
  """Path of each parameter in the Flax tree -> the names of its checkpoint tensors (one, or one per
  layer in layer order for a parameter under "layers") and the shape of each."""
  D, V, F, K = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.head_dim
  q_width, kv_width = cfg.num_attention_heads * K, cfg.num_key_value_heads * K
  names = {("embed_tokens", "embedding"): (("model.embed_tokens.weight",), (V, D)),
           ("norm", "scale"): (("model.norm.weight",), (D,))}
  if not cfg.tie_word_embeddings:
    names[("lm_head", "kernel")] = (("lm_head.weight",), (V, D))
  layer = {"input_layernorm": ("", (D,)), "post_attention_layernorm": ("", (D,)),
           "q_proj": ("self_attn.", (q_width, D)), "k_proj": ("self_attn.", (kv_width, D)),
           "v_proj": ("self_attn.", (kv_width, D)), "o_proj": ("self_attn.", (D, q_width)),
           "gate_proj": ("mlp.", (F, D)), "up_proj": ("mlp.", (F, D)), "down_proj": ("mlp.", (D, F))}
  if cfg.qk_norm:
    layer |= {"q_norm": ("self_attn.", (K,)), "k_norm": ("self_attn.", (K,))}
  for module, (group, shape) in layer.items():
    leaf = "scale" if len(shape) == 1 else "kernel"
    names[(lm_model.LAYERS, module, leaf)] = (tuple(f"model.layers.{i}.{group}{module}.weight"
                                             for i in range(cfg.num_hidden_layers)), shape)
  return names


def _param_shapes(cfg: lm_model.LMConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """Shape of each parameter of one set, traced from the model itself (nothing is computed)."""
  shapes_R = jax.eval_shape(lambda: lm_model.init_stack(cfg, jax.random.key(0), 1))
  return {path: s.shape[1:] for path, s in traverse_util.flatten_dict(shapes_R).items()}


def _per_layer(path: tuple[str, ...]) -> bool:
  """Whether the parameter at `path` is stacked over the layers (one checkpoint tensor per layer)."""
  return path[0] == lm_model.LAYERS


def _weight_files(directory: str) -> dict[str, str]:
  """Tensor name -> the safetensors file holding it."""
  single, index = os.path.join(directory, WEIGHTS), os.path.join(directory, INDEX)
  if os.path.isfile(single):
    with _reading(single), safe_open(single, framework="np") as f:
      return dict.fromkeys(f.keys(), single)
  if not os.path.isfile(index):
    raise FileNotFoundError(f"{directory} holds no weights: expected {WEIGHTS}, or {INDEX} and its shards")
  index_json = files.read_json(index)
  if "weight_map" not in index_json:
    raise ValueError(f"{index} has no weight_map (tensor name -> shard file)")
  weight_map = index_json["weight_map"]
  file_of = {name: os.path.join(directory, shard) for name, shard in weight_map.items()}
  for shard in sorted(set(file_of.values())):
    if not os.path.isfile(shard):
      raise FileNotFoundError(f"{shard} is missing: {index} lists it as a shard")
  return file_of


def load(directory: str, *, max_len: int = 256, dtype=jnp.float32):
  """(LMConfig, params): one float32 parameter set (numpy arrays) whatever the stored dtype."""
  cfg = lm_model.LMConfig.from_hf_config(read_hf_config(directory), max_len=max_len, dtype=dtype)
  file_of = _weight_files(directory)
  names = tensor_names(cfg)
  missing = sorted(name for names_N, _ in names.values() for name in names_N if name not in file_of)
  if missing:
    raise ValueError(f"{directory}: tensors {missing[:4]}{' ...' if len(missing) > 4 else ''} are missing "
                     f"({len(missing)} of {sum(len(n) for n, _ in names.values())} that model_type={cfg.model_type!r} with "
                     f"tie_word_embeddings={cfg.tie_word_embeddings} needs)")
  flax_shapes = _param_shapes(cfg)
  flat = {}
  with contextlib.ExitStack() as stack:
    opened = {}
    for file in sorted(set(file_of.values())):
      with _reading(file):
        opened[file] = stack.enter_context(safe_open(file, framework="np"))
    for path, (names_N, shape) in names.items():
      tensors_N = []
      for name in names_N:
        file = file_of[name]
        with _reading(file):
          tensor = opened[file].get_slice(name)
          found, dtype = tuple(tensor.get_shape()), tensor.get_dtype()
          if found != shape:
            raise ValueError(f"{file}: tensor {name!r} has shape {found}; config.json implies {shape}")
          if dtype not in WEIGHT_DTYPES:
            raise ValueError(f"{file}: tensor {name!r} is stored as {dtype}, not weights; allowed: "
                             f"{list(WEIGHT_DTYPES)} (a quantised checkpoint is not supported)")
          tensors_N.append(_to_flax(path, np.asarray(opened[file].get_tensor(name), np.float32),
                                    flax_shapes[path][1:] if _per_layer(path) else flax_shapes[path]))
      flat[path] = np.stack(tensors_N) if _per_layer(path) else tensors_N[0]
  return cfg, traverse_util.unflatten_dict(flat)


def _to_flax(path: tuple[str, ...], w: np.ndarray, flax_shape: tuple[int, ...]) -> np.ndarray:
  """weight[out, in] -> kernel[in..., out...]; embeddings and norm scales are stored as they are."""
  return w.T.reshape(flax_shape) if path[-1] == "kernel" else w


def _to_hf(path: tuple[str, ...], p: np.ndarray, hf_shape: tuple[int, ...]) -> np.ndarray:
  return p.reshape(hf_shape[::-1]).T if path[-1] == "kernel" else p


# Keys of a source checkpoint's config.json that the decoder does not model but a server reads: its
# special token ids (else transformers' class defaults: Llama's eos 2) and its context length.
SERVING_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings")


def save(directory: str, cfg: lm_model.LMConfig, params, source: dict | None = None) -> None:
  """Writes `config.json` and a float32 `model.safetensors` that `load` (and transformers) read back,
  with the `SERVING_KEYS` of `source` (the config.json it was trained from).  Refuses a directory that
  already holds a checkpoint: a save never replaces one."""
  os.makedirs(directory, exist_ok=True)
  existing = [f for f in (CONFIG, WEIGHTS, INDEX) if os.path.exists(os.path.join(directory, f))]
  if existing:
    raise FileExistsError(f"{directory} already holds {existing}; save into a new directory")
  flat = traverse_util.flatten_dict(params)
  flax_shapes = _param_shapes(cfg)
  tensors = {}
  for path, (names_N, hf_shape) in tensor_names(cfg).items():
    p = np.asarray(flat[path], np.float32)
    if p.shape != flax_shapes[path]:
      raise ValueError(f"params[{'/'.join(path)}] has shape {p.shape}, expected {flax_shapes[path]} "
                       "(one parameter set: index a stack params_R[r] first)")
    for name, p_one in zip(names_N, p if _per_layer(path) else [p]):
      tensors[name] = np.ascontiguousarray(_to_hf(path, p_one, hf_shape))
  # Written under temporary names and renamed, so an interrupted save leaves no half-written file.
  save_file(tensors, os.path.join(directory, WEIGHTS + ".tmp"), metadata={"format": "pt"})
  with open(os.path.join(directory, CONFIG + ".tmp"), "w") as f:
    serving = {k: source[k] for k in SERVING_KEYS if k in (source or {})}
    json.dump({**cfg.to_hf_config(), **serving}, f, indent=2)
  for name in (WEIGHTS, CONFIG):
    os.replace(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))
