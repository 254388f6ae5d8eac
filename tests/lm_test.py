"""marl_jax.lm against transformers: the tiny checkpoints of tests/fixtures/lm (scripts/make_lm_fixture.py)
and the logits and greedy continuations transformers computed for them."""
import functools
import json
import pathlib
import re
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from marl_jax.lm import hf_checkpoint
from marl_jax.lm import model as lm_model
from marl_jax.lm import tokenizer as lm_tokenizer

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "lm"
FAMILIES = ["qwen3", "llama", "llama_chatml"]  # llama_chatml: the Llama architecture speaking ChatML
LAYOUT = {"qwen3": "chatml", "llama": "llama3", "llama_chatml": "chatml"}  # as its tokenizer files say
_apply = jax.jit(lm_model.apply, static_argnums=0)


@functools.cache
def _load(family: str, dtype=jnp.float32):
  return hf_checkpoint.load(str(FIXTURES / family), max_len=40, dtype=dtype)


@functools.cache
def _reference(family: str) -> dict:
  return dict(np.load(FIXTURES / family / "reference.npz"))


@functools.cache
def _generation(family: str):
  """The reference prompts, left-padded to end together at canvas position P, continued greedily
  through the KV cache (prefill, then one token a step), as sampling.py does: returns the canvas
  tokens_BxT and the logits decoded_BxNxV that chose positions P..T-1."""
  cfg, params = _load(family)
  ref = _reference(family)
  (B, P), N = ref["tokens_BxP"].shape, ref["continuation_BxN"].shape[1]
  T = P + N
  tokens_BxT = jnp.zeros((B, T), jnp.int32).at[:, :P].set(ref["tokens_BxP"])
  key_ok_BxT = jnp.zeros((B, T), bool).at[:, :P].set(ref["mask_BxP"])
  logits_BxPxV, cache = _apply(cfg, params, tokens_BxT[:, :P], 0, key_ok_BxT,
                               lm_model.empty_cache(cfg, B, T))
  decoded = [logits_BxPxV[:, -1]]
  for t in range(P, T):
    tokens_BxT = tokens_BxT.at[:, t].set(jnp.argmax(decoded[-1], -1))
    key_ok_BxT = key_ok_BxT.at[:, t].set(True)
    if t < T - 1:
      logits_Bx1xV, cache = _apply(cfg, params, tokens_BxT[:, t:t + 1], t, key_ok_BxT, cache)
      decoded.append(logits_Bx1xV[:, 0])
  return tokens_BxT, key_ok_BxT, jnp.stack(decoded, 1)


@functools.cache
def _full_forward(family: str):
  """One parallel pass over the whole generated canvas, no cache."""
  tokens_BxT, key_ok_BxT, _ = _generation(family)
  cfg, params = _load(family)
  return _apply(cfg, params, tokens_BxT, 0, key_ok_BxT)[0]


def _max_prompt_diff(family: str, logits_BxPxV) -> tuple[float, float]:
  """Largest |logit - transformers' logit| over the prompts' (non-pad) positions, and the logit scale."""
  ref = _reference(family)
  diff = np.where(ref["mask_BxP"][..., None], np.abs(logits_BxPxV - ref["logits_BxPxV"]), 0)
  return float(diff.max()), float(np.abs(ref["logits_BxPxV"]).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_logits_match_transformers(family):
  P = _reference(family)["tokens_BxP"].shape[1]
  diff, scale = _max_prompt_diff(family, _full_forward(family)[:, :P])
  assert diff < 2e-5 * scale, (diff, scale)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_compute_logits_match_transformers_loosely(family):
  cfg, params = _load(family, jnp.bfloat16)
  assert all(p.dtype == np.float32 for p in jax.tree.leaves(params))  # parameters stay float32
  ref = _reference(family)
  logits_BxPxV, _ = _apply(cfg, params, ref["tokens_BxP"], 0, ref["mask_BxP"])
  assert logits_BxPxV.dtype == jnp.float32
  diff, scale = _max_prompt_diff(family, logits_BxPxV)
  assert diff < 0.03 * scale, (diff, scale)
  # The products ran in bfloat16: the logits round differently from the float32 forward's.
  assert cfg.dtype == jnp.bfloat16
  cfg32, params32 = _load(family, jnp.float32)
  exact_BxPxV, _ = _apply(cfg32, params32, ref["tokens_BxP"], 0, ref["mask_BxP"])
  assert float(jnp.abs(logits_BxPxV - exact_BxPxV).max()) > 1e-4 * scale


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_cached_generation_matches_transformers(family):
  ref = _reference(family)
  tokens_BxT, _, _ = _generation(family)
  np.testing.assert_array_equal(tokens_BxT[:, ref["tokens_BxP"].shape[1]:], ref["continuation_BxN"])


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decoding_equals_full_forward(family):
  _, _, decoded_BxNxV = _generation(family)
  P = _reference(family)["tokens_BxP"].shape[1]
  full_BxTxV = _full_forward(family)
  chex.assert_trees_all_close(decoded_BxNxV, full_BxTxV[:, P - 1:-1], atol=1e-5 * np.abs(full_BxTxV).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_init_stack_matches_checkpoint_layout_and_vmaps_over_sets(family):
  cfg, params = _load(family)
  params_R = jax.jit(lm_model.init_stack, static_argnums=(0, 2))(cfg, jax.random.key(0, impl="unsafe_rbg"), 2)
  assert jax.tree.structure(params_R) == jax.tree.structure(params)
  chex.assert_trees_all_equal_shapes(jax.tree.map(lambda p: p[0], params_R), params)
  # A stack of [the checkpoint, a fresh set]: vmapped, row 0 is the checkpoint's own forward pass.
  stack_R = jax.tree.map(lambda a, b: jnp.stack([a, b[1]]), params, params_R)
  tokens_BxT, key_ok_BxT, _ = _generation(family)
  apply_R = jax.jit(jax.vmap(functools.partial(lm_model.apply, cfg), in_axes=(0, None, None, None)))
  logits_RxBxTxV, _ = apply_R(stack_R, tokens_BxT, 0, key_ok_BxT)
  chex.assert_trees_all_close(logits_RxBxTxV[0], _full_forward(family), atol=1e-5)
  assert not np.allclose(logits_RxBxTxV[0], logits_RxBxTxV[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trips_exactly(family, tmp_path):
  cfg, params = _load(family)
  hf_checkpoint.save(str(tmp_path / "out"), cfg, params)
  cfg2, params2 = hf_checkpoint.load(str(tmp_path / "out"), max_len=cfg.max_len)
  assert cfg2 == cfg
  chex.assert_trees_all_equal(params2, params)
  # transformers picks the class and activation by these keys, which `load` does not read back: the
  # written config.json has the fixture's (transformers-written) values, rope in the 4.x layout.
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  fixture = json.loads((FIXTURES / family / "config.json").read_text())
  keys = ["model_type", "architectures", "hidden_act", "tie_word_embeddings", "head_dim", "num_key_value_heads",
          "num_attention_heads", "num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size",
          "rms_norm_eps"]
  assert {k: written[k] for k in keys} == {k: fixture[k] for k in keys}
  rope = fixture["rope_parameters"]
  assert written["rope_theta"] == rope["rope_theta"]
  assert written.get("rope_scaling", {"rope_type": "default"}) == {k: v for k, v in rope.items() if k != "rope_theta"}
  with pytest.raises(FileExistsError, match="already holds"):  # never over an existing checkpoint
    hf_checkpoint.save(str(tmp_path / "out"), cfg, params)


def test_save_refuses_stacked_parameter_sets(tmp_path):
  cfg, params = _load("qwen3")
  params_R = jax.tree.map(lambda p: np.stack([p, p]), params)
  with pytest.raises(ValueError, match=r"params\[embed_tokens/embedding\] has shape \(2, 384, 64\), expected "
                                       r"\(384, 64\) \(one parameter set: index a stack params_R\[r\] first\)"):
    hf_checkpoint.save(str(tmp_path / "out"), cfg, params_R)
  assert not list((tmp_path / "out").iterdir())  # refused before anything is written


def test_sharded_checkpoint_loads_like_one_file(tmp_path):
  src = FIXTURES / "llama"
  shutil.copy(src / "config.json", tmp_path)
  tensors = load_file(src / "model.safetensors")
  names = sorted(tensors)
  weight_map = {}
  for i, part in enumerate((names[::2], names[1::2])):
    shard = f"model-{i + 1:05d}-of-00002.safetensors"
    save_file({n: tensors[n] for n in part}, tmp_path / shard, metadata={"format": "pt"})
    weight_map |= dict.fromkeys(part, shard)
  (tmp_path / hf_checkpoint.INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  chex.assert_trees_all_equal(hf_checkpoint.load(str(tmp_path), max_len=40)[1], _load("llama")[1])


def test_flops_per_token_counts_every_matmul_weight():
  for family in FAMILIES:
    cfg, params = _load(family)
    flat = jax.tree_util.tree_leaves_with_path(params)
    weights = sum(p.size for path, p in flat if path[-1].key == "kernel")
    weights += cfg.vocab_size * cfg.hidden_size * cfg.tie_word_embeddings  # the embedding, as unembedding
    assert lm_model.flops_per_token(cfg, 0) == 2 * weights
    q_width = cfg.num_attention_heads * cfg.head_dim
    assert (lm_model.flops_per_token(cfg, 10) - lm_model.flops_per_token(cfg, 0)
            == 2 * cfg.num_hidden_layers * 2 * 10 * q_width)


def test_hf_config_layouts_and_defaults():
  hf5 = json.loads((FIXTURES / "llama" / "config.json").read_text())
  rope = dict(hf5.pop("rope_parameters"))
  # transformers-4 layout: rope_theta at the top, rope_scaling with the older `type` key.
  hf4 = {**hf5, "rope_theta": rope.pop("rope_theta"), "rope_scaling": {"type": rope.pop("rope_type"), **rope}}
  cfg = lm_model.LMConfig.from_hf_config(hf4, max_len=40)
  assert cfg == _load("llama")[0]
  assert cfg.rope_scaling == lm_model.Llama3RopeScaling(8.0, 1.0, 4.0, 64)
  # llama3 rescaling without its original length: transformers' fallback, max_position_embeddings.
  del hf4["rope_scaling"]["original_max_position_embeddings"]
  assert lm_model.LMConfig.from_hf_config(hf4).rope_scaling.original_max_position_embeddings == 128
  plain = {k: v for k, v in hf4.items()
           if k not in ("head_dim", "num_key_value_heads", "rope_scaling", "tie_word_embeddings")}
  cfg = lm_model.LMConfig.from_hf_config(plain)
  assert (cfg.head_dim, cfg.num_key_value_heads, cfg.rope_scaling, cfg.tie_word_embeddings) == (16, 4, None, False)
  # llama3 rescaling: the highest frequency is kept, the lowest divided by `factor`.
  inv_freq = lm_model.rope_frequencies(_load("llama")[0])
  plain_freq = lm_model.rope_frequencies(cfg)
  np.testing.assert_allclose([inv_freq[0], inv_freq[-1]], [plain_freq[0], plain_freq[-1] / 8], rtol=1e-6)


def _copy(tmp_path, family="qwen3", files=("config.json", "model.safetensors", "tokenizer.json")):
  for name in files:
    shutil.copy(FIXTURES / family / name, tmp_path)
  return tmp_path


def _edit_config(tmp_path, family="qwen3", drop=(), **changes):
  """The family's checkpoint, its config.json with `changes` and without the keys `drop` names (a key
  of a nested dict as "outer/inner")."""
  path = _copy(tmp_path, family) / "config.json"
  hf = {**json.loads(path.read_text()), **changes}
  for key in drop:
    *outer, inner = key.split("/")
    functools.reduce(dict.__getitem__, outer, hf).pop(inner)
  path.write_text(json.dumps(hf))
  return tmp_path


def _edit_tensors(tmp_path, edit):
  path = _copy(tmp_path) / "model.safetensors"
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path)
  return tmp_path


def _index_of_absent_shard(tmp_path):
  index = {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
  (_copy(tmp_path, files=["config.json"]) / hf_checkpoint.INDEX).write_text(json.dumps(index))
  return tmp_path


def _write(tmp_path, name, text):
  (_copy(tmp_path) / name).write_text(text)
  return tmp_path


def _truncated_weights(tmp_path):
  path = _copy(tmp_path) / "model.safetensors"
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  return tmp_path


def _index_without_weight_map(tmp_path):
  (_copy(tmp_path, files=["config.json"]) / hf_checkpoint.INDEX).write_text('{"metadata": {}}')
  return tmp_path


LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize 123456\n".format("0" * 64)
UNREADABLE = r"model.safetensors is not a readable safetensors file \(.*\): a truncated download or a Git LFS"
BAD_CHECKPOINTS = {  # name -> (make the bad directory in tmp_path, error, what its message names)
    "missing directory": (lambda d: d / "absent", FileNotFoundError, r"absent' does not exist"),
    "missing config.json": (lambda d: _copy(d, files=["model.safetensors"]), FileNotFoundError,
                            r"config.json is missing"),
    "no weights": (lambda d: _copy(d, files=["config.json"]), FileNotFoundError,
                   r"holds no weights: expected model.safetensors, or model.safetensors.index.json"),
    "missing shard": (_index_of_absent_shard, FileNotFoundError,
                      r"model-00001-of-00002.safetensors is missing"),
    "unsupported model_type": (lambda d: _edit_config(d, model_type="gpt2"), ValueError,
                               r"model_type='gpt2' is not supported; allowed: \['llama', 'qwen3'\]"),
    "unknown rope type": (lambda d: _edit_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0}),
                          ValueError, r"rope_type='yarn' is not supported; allowed: \['default', 'llama3'\]"),
    "unsupported activation": (lambda d: _edit_config(d, hidden_act="gelu"), ValueError,
                               r"hidden_act='gelu' is not supported; allowed: 'silu'"),
    "missing tensor": (lambda d: _edit_tensors(d, lambda t: t.pop("model.layers.1.mlp.down_proj.weight")),
                       ValueError, r"\['model.layers.1.mlp.down_proj.weight'\] are missing"),
    "wrong shape": (lambda d: _edit_tensors(
        d, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((64, 64), np.float32)})),
        ValueError, r"'model.layers.0.self_attn.k_proj.weight' has shape \(64, 64\); config.json implies "
                    r"\(32, 64\)"),
    "quantised tensor": (lambda d: _edit_tensors(
        d, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.ones((32, 64), np.int8)})),
        ValueError, (r"'model.layers.0.self_attn.k_proj.weight' is stored as I8, not weights; allowed: "
                     r"\['F64', 'F32', 'BF16', 'F16'\]")),
    "quantised config": (lambda d: _edit_config(d, quantization_config={"quant_method": "bitsandbytes"}),
                         ValueError, r"quantization_config \(quant_method='bitsandbytes'\) is not supported"),
    "truncated weights": (_truncated_weights, ValueError, UNREADABLE),
    "git lfs pointer": (lambda d: _write(d, "model.safetensors", LFS_POINTER), ValueError, UNREADABLE),
    "config.json not json": (lambda d: _write(d, "config.json", '{"model_type": "qwen3", '), ValueError,
                             r"config.json is not valid JSON \(Expecting property name"),
    "index without weight_map": (_index_without_weight_map, ValueError,
                                 r"model.safetensors.index.json has no weight_map"),
    "llama3 rope without factor": (lambda d: _edit_config(d, "llama", drop=["rope_parameters/factor"]),
                                   ValueError, r"rope_type='llama3' lacks \['factor'\]"),
    # Neither the original length nor max_position_embeddings, transformers' fallback for it.
    "llama3 rope without any length": (lambda d: _edit_config(
        d, "llama", drop=["rope_parameters/original_max_position_embeddings", "max_position_embeddings"]),
        ValueError, r"rope_type='llama3' lacks \['original_max_position_embeddings'\]"),
    "missing vocab_size": (lambda d: _edit_config(d, drop=["vocab_size"]), ValueError,
                           r"config.json lacks \['vocab_size'\], required for model_type='qwen3'"),
    "attention bias": (lambda d: _edit_config(d, attention_bias=True), ValueError,
                       r"attention_bias=True is not supported; allowed: False"),
    "mlp bias": (lambda d: _edit_config(d, mlp_bias=True), ValueError,
                 r"mlp_bias=True is not supported; allowed: False"),
    "sliding window": (lambda d: _edit_config(d, use_sliding_window=True), ValueError,
                       r"use_sliding_window=True is not supported; allowed: False"),
    "partial rotary": (lambda d: _edit_config(d, partial_rotary_factor=0.5), ValueError,
                       r"partial_rotary_factor=0.5 is not supported; allowed: 1.0"),
    "kv heads not dividing": (lambda d: _edit_config(d, num_key_value_heads=3), ValueError,
                              r"num_key_value_heads=3 must divide num_attention_heads=4"),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_unquantised_stored_dtypes_load(dtype, tmp_path):
  _edit_tensors(tmp_path, lambda t: t.update({k: v.astype(dtype) for k, v in t.items()}))
  _, params = hf_checkpoint.load(str(tmp_path), max_len=40)
  _, params32 = _load("qwen3")
  chex.assert_trees_all_close(params, jax.tree.map(lambda p: np.asarray(p, dtype).astype(np.float32), params32))


@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_bad_checkpoint_errors_name_the_file_or_key(case, tmp_path):
  make, error, message = BAD_CHECKPOINTS[case]
  with pytest.raises(error, match=message):
    hf_checkpoint.load(str(make(tmp_path)))


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_matches_the_fixture_and_renders_chat(family):
  tok = lm_tokenizer.load(str(FIXTURES / family))
  assert tok.layout == lm_tokenizer.LAYOUTS[LAYOUT[family]]
  ref = _reference(family)
  prompts = [ids[ok] for ids, ok in zip(ref["tokens_BxP"], ref["mask_BxP"])]
  for text, ids in zip(ref["prompts_B"][:2], prompts):
    assert tok.encode(str(text)) == list(ids)
    assert tok.decode(ids) == text
  # The third prompt was written out by hand in the fixture script: one user turn, then the
  # assistant's header.
  assert tok.render_chat([("user", "What is 4 + 9?")], next_role="assistant") == list(prompts[2])
  eot = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}[LAYOUT[family]]
  assert tok.end_of_turn_id == tok.tok.token_to_id(eot)
  turns = [("system", "Add."), ("user", "1 + 2"), ("assistant", "3")]
  ids = tok.render_chat(turns)
  assert ids.count(tok.end_of_turn_id) == 3
  # The layouts as the issue states them, written out independently of tokenizer.py.
  turn = {"chatml": "<|im_start|>{r}\n{t}<|im_end|>\n",
          "llama3": "<|start_header_id|>{r}<|end_header_id|>\n\n{t}<|eot_id|>"}[LAYOUT[family]]
  expected = "".join(turn.format(r=r, t=t) for r, t in turns)
  assert tok.decode(ids) == ("<|begin_of_text|>" if LAYOUT[family] == "llama3" else "") + expected


def test_an_unreadable_tokenizer_is_refused_naming_it(tmp_path):
  text = (FIXTURES / "qwen3" / "tokenizer.json").read_text()
  _write(tmp_path, "tokenizer.json", text[:len(text) // 2])
  with pytest.raises(ValueError, match=r"tokenizer.json is not a readable tokenizer \(EOF while parsing"):
    lm_tokenizer.load(str(tmp_path))


def test_llama_architecture_with_chatml_tokens_renders_a_chatml_turn():
  """SmolLM's case: nothing in config.json (model_type llama) says ChatML, its tokenizer files do."""
  directory = FIXTURES / "llama_chatml"
  assert json.loads((directory / "config.json").read_text())["model_type"] == "llama"
  tok = lm_tokenizer.load(str(directory))
  start, end = tok.tok.token_to_id("<|im_start|>"), tok.tok.token_to_id("<|im_end|>")
  ids = tok.render_chat([("user", "What is 4 + 9?")], next_role="assistant")
  assert ids == [start, *tok.encode("user\nWhat is 4 + 9?"), end, *tok.encode("\n"), start,
                 *tok.encode("assistant\n")]
  assert tok.tok.id_to_token(ids[0]) == "<|im_start|>" and tok.end_of_turn_id == end
  assert tok.decode(ids) == "<|im_start|>user\nWhat is 4 + 9?<|im_end|>\n<|im_start|>assistant\n"


def test_qwen3_architecture_with_llama3_tokens_loads_in_the_llama3_layout(tmp_path):
  _copy(tmp_path, "qwen3", ("config.json", "model.safetensors"))
  _copy(tmp_path, "llama", ("tokenizer.json",))
  tok = lm_tokenizer.load(str(tmp_path))
  assert tok.layout == lm_tokenizer.LAYOUTS["llama3"] and tok.end_of_turn_id == tok.tok.token_to_id("<|eot_id|>")
  assert hf_checkpoint.load(str(tmp_path), max_len=40)[0].model_type == "qwen3"


CHATML_TEMPLATE = "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' }}"
LLAMA3_TEMPLATE = ("{{ bos_token }}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
                   "+ message['content'] + '<|eot_id|>' }}")
BOTH = (r"it holds the tokens of the layouts \['chatml', 'llama3'\] and no chat template singles one out")


def _both_layouts(tmp_path, **files):
  """The ChatML fixture's tokenizer with Llama-3's special tokens added, and `files` (name: text)."""
  tok = lm_tokenizer.load(str(FIXTURES / "llama_chatml")).tok
  tok.add_special_tokens(lm_tokenizer.needed_tokens(lm_tokenizer.LAYOUTS["llama3"]))
  tok.save(str(tmp_path / "tokenizer.json"))
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  return str(tmp_path)


@pytest.mark.parametrize("files, layout", [
    ({"tokenizer_config.json": json.dumps({"chat_template": CHATML_TEMPLATE})}, "chatml"),
    ({"tokenizer_config.json": json.dumps({"chat_template": LLAMA3_TEMPLATE})}, "llama3"),
    # Named templates (a default and a tool-use one) are read together.
    ({"tokenizer_config.json": json.dumps({"chat_template": [{"name": "default", "template": LLAMA3_TEMPLATE},
                                                             {"name": "tool_use", "template": "{{ tools }}"}]})},
     "llama3"),
    # Newer transformers write chat_template.jinja, which comes before tokenizer_config.json's.
    ({"chat_template.jinja": LLAMA3_TEMPLATE,
      "tokenizer_config.json": json.dumps({"chat_template": CHATML_TEMPLATE})}, "llama3"),
    # A template in a layout marl_jax does not know leaves the choice to the tokens: here both, refused.
    ({"tokenizer_config.json": json.dumps({"chat_template": "{{ '<start_of_turn>' + message['role'] }}"})}, BOTH),
    ({}, BOTH),
], ids=["chatml template", "llama3 template", "named templates", "jinja file first", "unknown template",
        "no template"])
def test_the_chat_template_decides_between_layouts_the_tokenizer_holds(files, layout, tmp_path):
  directory = _both_layouts(tmp_path, **files)
  if layout in lm_tokenizer.LAYOUTS:
    assert lm_tokenizer.load(directory).layout == lm_tokenizer.LAYOUTS[layout]
  else:
    with pytest.raises(ValueError, match=r"tokenizer.json: " + layout):
      lm_tokenizer.load(directory)


def test_a_tokenizer_of_no_known_layout_is_refused_naming_the_layouts_and_their_tokens(tmp_path):
  # The Qwen3 fixture's tokenizer with <|im_end|> renamed: ChatML lacks it, Llama-3 lacks all four.
  text = (FIXTURES / "qwen3" / "tokenizer.json").read_text()
  _write(tmp_path, "tokenizer.json", text.replace("<|im_end|>", "<|renamed|>"))
  message = ("tokenizer.json: it holds the tokens of no known chat layout; known layouts and the tokens each "
             "needs: chatml needs ['<|im_start|>', '<|im_end|>'] (lacks ['<|im_end|>']); llama3 needs "
             "['<|begin_of_text|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>'] (lacks "
             "['<|begin_of_text|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>'])")
  with pytest.raises(ValueError, match=re.escape(message)):
    lm_tokenizer.load(str(tmp_path))


def test_a_template_of_a_layout_the_tokenizer_lacks_is_refused(tmp_path):
  shutil.copy(FIXTURES / "llama_chatml" / "tokenizer.json", tmp_path)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": LLAMA3_TEMPLATE}))
  with pytest.raises(ValueError, match=r"its chat template writes the llama3 layout, which it lacks tokens of; "
                                       r"known layouts .* llama3 needs .* \(lacks \['<\|begin_of_text\|>'"):
    lm_tokenizer.load(str(tmp_path))


@pytest.mark.parametrize("tokenizer_config, message", [
    ({"chat_template": {"default": CHATML_TEMPLATE}},
     r"tokenizer_config.json chat_template is dict; allowed: a string or a list of \{'name': ..., 'template': "
     r"string\}"),
    ([CHATML_TEMPLATE], r"tokenizer_config.json is a JSON list; allowed: a JSON object")])
def test_a_tokenizer_config_of_another_shape_is_refused_naming_the_key(tokenizer_config, message, tmp_path):
  shutil.copy(FIXTURES / "llama_chatml" / "tokenizer.json", tmp_path)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
  with pytest.raises(ValueError, match=message):
    lm_tokenizer.load(str(tmp_path))
