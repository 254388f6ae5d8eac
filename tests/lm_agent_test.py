"""Language-model agents in the engine (`marl_jax.lm.agent`): the symbol table of each fixture tokenizer,
the agent's logits against the decoder's own (with and without LoRA adapters), a checkpoint as every
seed's and set's starting point, bad checkpoints refused before compiling, and a tiny solver-verifier
run through the real CLI on each family (Llama with LoRA), exported back to the Hugging Face format."""
import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from marl_jax import checkpoint as checkpoint_lib, configs, experiment, loop, model as model_lib
from marl_jax import state as state_lib, text, train
from marl_jax.lm import agent as lm_agent
from marl_jax.lm import hf_checkpoint
from marl_jax.tools import lm_export
from marl_jax.lm import lora as lora_lib
from marl_jax.lm import model as lm_model
from marl_jax.lm import tokenizer as lm_tokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lm"
FAMILIES = ["qwen3", "llama", "llama_chatml"]  # llama_chatml: the Llama architecture speaking ChatML


def _model_config(family, **overrides):
  settings = dict(max_len=24, dtype="float32", checkpoint=str(FIXTURES / family), random_weights=False,
                  lora=dict(enabled=False))
  return ml_collections.ConfigDict(dict(settings, **overrides))


@pytest.mark.parametrize("family", FAMILIES)
def test_symbol_table(family):
  tok = lm_tokenizer.load(str(FIXTURES / family))
  ids_V = lm_agent.symbol_ids(tok)
  assert len(ids_V) == text.VOCAB_SIZE
  assert ids_V[text.EOS] == tok.end_of_turn_id
  bos = {"qwen3": "<|im_start|>", "llama": "<|begin_of_text|>", "llama_chatml": "<|im_start|>"}[family]
  assert ids_V[text.BOS] == tok.tok.token_to_id(bos)
  for symbol in "0123456789+-*=az":
    assert ids_V[text.TOKEN_ID[symbol]] == tok.encode(symbol)[0]
  assert [tok.decode([ids_V[text.role_marker(k)]]) for k in range(3)] == ["A", "B", "C"]
  # Neither fixture holds "yes" or "no" as one token: the verifier's verdicts are "Y" and "N".
  assert [tok.decode([ids_V[text.TOKEN_ID[s]]]) for s in ("<accept>", "<reject>", "<sep>", "<absent>")
          ] == ["Y", "N", "\n", "_"]
  readable = [i for s, i in zip(text.TOKENS, ids_V) if s != "<pad>" and not s.startswith("<unused")]
  assert len(set(readable)) == len(readable)  # the model tells every symbol apart


def test_symbol_takes_its_first_single_token_text(monkeypatch):
  tok = lm_tokenizer.load(str(FIXTURES / "qwen3"))
  monkeypatch.setitem(lm_agent.SPECIAL_TEXT, "<accept>", ("<accept> as words", "Z", "Y"))
  assert tok.decode([lm_agent.symbol_ids(tok)[text.TOKEN_ID["<accept>"]]]) == "Z"


def test_symbol_without_a_single_token_is_refused(monkeypatch):
  monkeypatch.setitem(lm_agent.SPECIAL_TEXT, "<sep>", ("<sep> as words",))
  with pytest.raises(ValueError, match=r"symbol '<sep>'.*single token"):
    lm_agent.symbol_ids(lm_tokenizer.load(str(FIXTURES / "qwen3")))


def test_two_symbols_on_one_token_are_refused(monkeypatch):
  tok = lm_tokenizer.load(str(FIXTURES / "qwen3"))
  monkeypatch.setitem(lm_agent.SPECIAL_TEXT, "<sep>", ("+",))  # the sum's "+" is its own symbol
  with pytest.raises(ValueError, match=rf"symbols '<sep>' and '\+' are both token {tok.encode('+')[0]} "):
    lm_agent.symbol_ids(tok)


@pytest.mark.parametrize("family", FAMILIES)
def test_agent_logits_are_the_decoders_at_the_symbols(family):
  """Tied (Qwen3, ChatML Llama) and untied (Llama) unembeddings: the agent's logits over symbols are the
  decoder's logits of those symbols' tokens, through prefill and one cached decoding step."""
  agent = lm_agent.from_config(_model_config(family))
  params = agent.pretrained_stack(1)
  params = jax.tree.map(lambda p: jnp.asarray(p[0]), params)
  tokens_BxL = jnp.array([text.encode("<bos>3+4*2=<role0>8<eos>"), text.encode("<bos>9-1*3=<role0>4<eos>")])
  B, L = tokens_BxL.shape
  ok_BxT = jnp.ones((B, agent.max_len), bool).at[:, L:].set(False)
  # Each call compiled as one program: run op by op, the model's hundreds of ops compile one at a time.
  full_BxLxW, _ = jax.jit(functools.partial(lm_model.apply, agent.lm), static_argnums=2)(
      params, jnp.asarray(agent.canvas_ids_V)[tokens_BxL], 0, ok_BxT[:, :L])
  expected_BxLxV = full_BxLxW[..., np.array(agent.canvas_ids_V)]
  apply = jax.jit(functools.partial(model_lib.apply, agent), static_argnums=2)
  got_BxLxV, _ = apply(params, tokens_BxL, 0, ok_BxT[:, :L])
  np.testing.assert_allclose(got_BxLxV, expected_BxLxV, atol=1e-5, rtol=1e-5)
  cache = model_lib.empty_cache(agent, B, agent.max_len)
  _, cache = apply(params, tokens_BxL[:, :-1], 0, ok_BxT.at[:, L - 1:].set(False), cache)
  last_Bx1xV, _ = apply(params, tokens_BxL[:, -1:], L - 1, ok_BxT, cache)
  np.testing.assert_allclose(last_Bx1xV[:, 0], expected_BxLxV[:, -1], atol=1e-5, rtol=1e-5)
  # The agent unembeds only the 96 symbols: the vocabulary's other rows' D multiply-adds are not spent.
  assert (lm_model.flops_per_token(agent.lm, 10) - agent.flops_per_token(10)
          == 2 * agent.lm.hidden_size * (agent.lm.vocab_size - text.VOCAB_SIZE))


def test_every_seed_and_set_starts_from_the_checkpoint():
  config = _config("qwen3")
  config.sft.steps = 0
  config.num_seeds = 2
  exp = experiment.build(config)
  params_S = state_lib.to_host(loop.initial_state(exp).params)
  _, loaded = hf_checkpoint.load(str(FIXTURES / "qwen3"))
  for got, want in zip(jax.tree.leaves(params_S), jax.tree.leaves(loaded)):
    assert got.shape == (2, 2) + want.shape  # seeds x parameter sets (isolated solver, verifier)
    np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
  config.model.random_weights = True
  random_S = state_lib.to_host(loop.initial_state(experiment.build(config)).params)
  assert not np.allclose(jax.tree.leaves(random_S)[0], jax.tree.leaves(params_S)[0])


def test_a_run_of_the_per_layer_decoder_is_refused_saying_why(tmp_path):
  # Before the decoder stacked its layers (commit 42ba1d4 and earlier) a run saved layer0/...,
  # layer1/...: resuming, warm-starting from or exporting it names that and the commit to use.
  config = _config("qwen3")
  config.sft.steps = 0
  exp = experiment.build(config)
  state_S = loop.initial_state(exp)
  params_S = dict(state_lib.to_host(state_S.params))
  layers = params_S.pop("layers")
  assert jax.tree.leaves(layers)[0].shape[:3] == (1, 2, 2)  # seeds x parameter sets x layers
  old_params_S = {**params_S, **{f"layer{i}": jax.tree.map(lambda x, i=i: x[:, :, i], layers) for i in range(2)}}
  with checkpoint_lib.manager(str(tmp_path)) as mngr:
    checkpoint_lib.save(mngr, 0, {"params": old_params_S})
  (tmp_path / "config.json").write_text(config.to_json())
  said = "was written by a marl_jax whose language-model decoder kept one parameter subtree per layer"
  with pytest.raises(ValueError, match=f"checkpoint 0 in {tmp_path} {said}.*at commit 42ba1d4 or earlier"):
    checkpoint_lib.restore(str(tmp_path), exp.abstract(state_S))
  with pytest.raises(ValueError, match=f"config.init_from='{tmp_path}' {said}"):
    loop.load_params(exp, str(tmp_path))
  # The export names its own flag, not config.init_from.
  with pytest.raises(ValueError, match=f"^--workdir={tmp_path} {said}"):
    lm_export.export(str(tmp_path), "verifier", str(tmp_path / "hf"))
  # The built-in model's blocks (block0, ...) and a checkpoint of this layout are not mistaken for it.
  assert not checkpoint_lib.per_layer_decoder({"params": {**params_S, "layers": layers}})
  assert not checkpoint_lib.per_layer_decoder({"params": {"block0": {"kernel": np.zeros(2)}}})


def _config(family):
  experiment_file = str(REPO / "experiments" / "lm_solver_verifier.py")
  return configs.sibling(experiment_file, "lm_solver_verifier").get_config(
      f"size=tiny,checkpoint={FIXTURES / family}")


def test_bad_checkpoints_are_refused_before_compiling(tmp_path):
  with pytest.raises(ValueError, match=r"config.model.checkpoint='/no/such'.*does not exist"):
    lm_agent.from_config(_model_config("qwen3", checkpoint="/no/such"))
  no_weights = tmp_path / "no_weights"
  no_weights.mkdir()
  for name in ("config.json", "tokenizer.json"):
    shutil.copy(FIXTURES / "qwen3" / name, no_weights)
  with pytest.raises(ValueError, match=r"config.model.checkpoint=.*holds no weights"):
    lm_agent.from_config(_model_config("qwen3", checkpoint=str(no_weights)))
  assert lm_agent.from_config(_model_config("qwen3", checkpoint=str(no_weights), random_weights=True))
  hf = json.loads((no_weights / "config.json").read_text())
  (no_weights / "config.json").write_text(json.dumps(dict(hf, vocab_size=64)))  # the symbols' ids reach 201
  with pytest.raises(ValueError, match=r"config.model.checkpoint=.*tokenizer gives token \d+, beyond the "
                     r"model's vocab_size=64"):
    lm_agent.from_config(_model_config("qwen3", checkpoint=str(no_weights), random_weights=True))
  other = tmp_path / "other_arch"
  shutil.copytree(FIXTURES / "qwen3", other)
  hf = json.loads((other / "config.json").read_text())
  (other / "config.json").write_text(json.dumps(dict(hf, model_type="gpt2")))
  with pytest.raises(ValueError, match=r"config.model.checkpoint=.*model_type='gpt2'.*allowed"):
    lm_agent.from_config(_model_config("qwen3", checkpoint=str(other)))
  # safetensors' and tokenizers' own errors (not OSError or ValueError) are named like the rest.
  pointer = tmp_path / "lfs_pointer"
  shutil.copytree(FIXTURES / "qwen3", pointer)
  (pointer / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\nsize 12\n")
  with pytest.raises(ValueError, match=r"config.model.checkpoint=.*model.safetensors is not a readable safetensors"):
    lm_agent.from_config(_model_config("qwen3", checkpoint=str(pointer)))
  (pointer / "tokenizer.json").write_text("{")
  with pytest.raises(ValueError, match=r"config.model.checkpoint=.*tokenizer.json is not a readable tokenizer"):
    lm_agent.from_config(_model_config("qwen3", checkpoint=str(pointer), random_weights=True))


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_lora_agent_is_the_adapted_decoder():
  """With LoRA the sets are one shared base and stacked adapters: fresh adapters give the base's logits
  exactly, trained ones `lm.lora.apply`'s; the optimiser holds state for the adapters only, and the
  base gets no update."""
  plain = lm_agent.from_config(_model_config("llama"))
  lora_cfg = ml_collections.ConfigDict(dict(enabled=True, rank=2, alpha=4.0, targets="q_proj,down_proj"))
  agent = lm_agent.from_config(_model_config("llama", lora=lora_cfg))
  assert agent.lora == lora_lib.LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "down_proj"))
  # Three sets share one base (not stacked) and stack their adapters.
  params_R = agent.pretrained_stack(3)
  assert jax.tree.map(np.shape, params_R["base"]) == jax.tree.map(np.shape, hf_checkpoint.load(
      str(FIXTURES / "llama"), max_len=24)[1])
  assert {p.shape[0] for p in jax.tree.leaves(params_R["adapter"])} == {3}
  adapted = {path[-2].key for path, _ in jax.tree_util.tree_leaves_with_path(params_R["adapter"])}
  assert adapted == {"q_proj", "down_proj"}, jax.tree_util.tree_leaves_with_path(params_R["adapter"])[:2]
  params = jax.tree.map(jnp.asarray, model_lib.take_sets(agent, params_R, 1))
  tokens_BxL = jnp.array([text.encode("<bos>3+4*2=<role0>8<eos>")])
  ok_BxL = jnp.ones(tokens_BxL.shape, bool)
  base_logits, _ = model_lib.apply(plain, params["base"], tokens_BxL, 0, ok_BxL)
  np.testing.assert_array_equal(model_lib.apply(agent, params, tokens_BxL, 0, ok_BxL)[0], base_logits)
  adapter = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(1), p.shape), params["adapter"])
  trained = {"base": params["base"], "adapter": adapter}
  full, _ = lora_lib.apply(agent.lm, lora_lib.LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "down_proj")),
                           params["base"], adapter,
                           jnp.asarray(agent.canvas_ids_V)[tokens_BxL], 0, ok_BxL)
  np.testing.assert_allclose(model_lib.apply(agent, trained, tokens_BxL, 0, ok_BxL)[0],
                             full[..., np.array(agent.canvas_ids_V)], atol=1e-5, rtol=1e-5)
  tx = model_lib.trainable(agent, optax.adam(0.1))
  state = tx.init(trained)
  adapter_size = sum(p.size for p in jax.tree.leaves(adapter))
  assert sum(p.size for p in jax.tree.leaves(state)) == 2 * adapter_size + 1  # mu, nu and a count
  grads = jax.grad(lambda p: model_lib.apply(agent, p, tokens_BxL, 0, ok_BxL)[0].sum())(trained)
  assert all(not g.any() for g in jax.tree.leaves(grads["base"]))  # read through stop_gradient
  updates, _ = tx.update(jax.tree.map(jnp.ones_like, trained), state, trained)
  assert all(not u.any() for u in jax.tree.leaves(updates["base"]))
  assert all(u.any() for u in jax.tree.leaves(updates["adapter"]))
  with pytest.raises(ValueError, match=r"^config.model.lora.rank=0 must be an integer >= 1"):
    lm_agent.from_config(_model_config("llama", lora=dict(lora_cfg, rank=0)))
  with pytest.raises(ValueError, match=r"^config.models.verifier.lora.targets='q_proj,qkv_proj': unknown"):  # a mixed team's
    lm_agent.from_config(_model_config("llama", lora=dict(lora_cfg, targets="q_proj,qkv_proj")),
                         key="config.models.verifier")
  with pytest.raises(ValueError, match=r"lora.enabled=True needs config.model.checkpoint"):
    experiment.make_model(ml_collections.ConfigDict(dict(_model_config("llama", lora=lora_cfg),
                                                         checkpoint="")))


@pytest.mark.slow  # a LoRA team trained through the step: over 10 s
def test_lora_team_holds_one_base():
  """An isolated LoRA solver-verifier: the training state holds the base once per seed (no set axis),
  two sets of adapters and their Adam moments only; a training call leaves the base bit-identical."""
  config = configs.sibling(str(REPO / "experiments" / "x.py"), "lm_solver_verifier").get_config(
      "size=tiny,lora=true,checkpoint=" + str(FIXTURES / "llama"))
  config.update(sft=dict(config.sft, steps=0), steps_per_call=1, num_seeds=1)
  config.rl.entropy_coef = 0.01  # a gradient even when every reward of the untrained team ties
  exp = experiment.build(config)
  state_S = loop.initial_state(exp)
  _, base = hf_checkpoint.load(str(FIXTURES / "llama"), max_len=exp.model.max_len)
  assert jax.tree.map(lambda p: p.shape[1:], state_S.params["base"]) == jax.tree.map(np.shape, base)
  assert {p.shape[:2] for p in jax.tree.leaves(state_S.params["adapter"])} == {(1, 2)}
  adapter_size = sum(p.size for p in jax.tree.leaves(state_S.params["adapter"]))
  moments = [p for p in jax.tree.leaves(state_S.opt_state) if p.ndim > 2]
  assert sum(p.size for p in moments) == 2 * adapter_size
  adapter_before = jax.device_get(state_S.params["adapter"])
  trained_S, _ = train.make_train_call(exp)(state_S)  # donates state_S
  chex.assert_trees_all_equal(jax.device_get(trained_S.params["base"]),
                              jax.tree.map(lambda p: p[None], base))
  assert optax.tree_utils.tree_norm(jax.tree.map(lambda a, b: a - b, jax.device_get(
      trained_S.params["adapter"]), adapter_before)) > 0


def test_export_copies_the_tokenizer_files_a_server_reads(tmp_path):
  source, out = tmp_path / "source", tmp_path / "out"
  shutil.copytree(FIXTURES / "qwen3", source)
  (source / "chat_template.jinja").write_text("{{ messages }}")
  (source / "additional_chat_templates").mkdir()
  (source / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}")
  out.mkdir()
  lm_export.copy_tokenizer_files(str(source), str(out))
  assert sorted(p.name for p in out.iterdir()) == ["additional_chat_templates", "chat_template.jinja",
                                                    "tokenizer.json"]
  assert (out / "additional_chat_templates" / "tool_use.jinja").read_text() == "{{ tools }}"


def test_export_refuses_what_it_cannot_write_before_reading_checkpoints(tmp_path):
  """A role the run lacks, a seed it lacks and a built-in-model role are refused from the run's
  config.json alone, naming what is allowed (the workdirs hold no checkpoint to read)."""
  lm_run, builtin_run = tmp_path / "lm", tmp_path / "builtin"
  lm_config = _config("qwen3")
  builtin = configs.sibling(str(REPO / "experiments" / "solver_verifier.py"), "solver_verifier").get_config(
      "size=tiny")
  for workdir, config in ((lm_run, lm_config), (builtin_run, builtin)):
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match=r"--role='judge' is not a role of this run; allowed: \['solver', 'verifier'\]"):
    lm_export.export(str(lm_run), "judge", out)
  seeds = lm_config.num_seeds
  with pytest.raises(ValueError, match=rf"--seed={seeds}: the run has seeds 0\.\.{seeds - 1}$"):
    lm_export.export(str(lm_run), "verifier", out, seed=seeds)
  with pytest.raises(ValueError, match=r"role 'verifier' is the built-in model"):
    lm_export.export(str(builtin_run), "verifier", out)
  (builtin_run / "config.json").write_text("[1, 2]")  # the message named no file
  with pytest.raises(ValueError, match=rf"^{builtin_run}/config.json is not a JSON object; allowed: the config"):
    lm_export.export(str(builtin_run), "verifier", out)
  assert not os.path.exists(out)


@pytest.mark.slow
@pytest.mark.parametrize("family, lora, verifier", [("qwen3", False, "llama"), ("llama", True, ""),
                                                    ("llama_chatml", False, "")])
def test_tiny_solver_verifier_through_the_cli_and_export(family, lora, verifier, tmp_path):
  """A full run of each family (Llama with LoRA adapters; a mixed team of a Qwen3 solver and a Llama
  verifier; a Llama speaking ChatML), then its verifier exported and read back."""
  workdir, out = tmp_path / "run", tmp_path / "verifier_hf"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  arg = f"size=tiny,checkpoint={FIXTURES / family},lora={str(lora).lower()}"
  if verifier:
    arg += f",verifier_checkpoint={FIXTURES / verifier}"
  run = subprocess.run(
      [sys.executable, "-m", "marl_jax.main", f"--config={REPO / 'experiments' / 'lm_solver_verifier.py'}:{arg}",
       f"--workdir={workdir}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  trained = [m for m in lines if "verifier/loss" in m]
  assert trained and all(np.isfinite(m["verifier/loss"]) and m["tokens"] > 0 for m in trained)
  assert any("eval_accuracy" in m for m in lines)
  export = subprocess.run([sys.executable, "-m", "marl_jax.tools.lm_export", f"--workdir={workdir}",
                           "--role=verifier", f"--out={out}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  assert export.returncode == 0, export.stderr[-3000:]
  # The exported tokenizer files choose the source's chat layout.
  assert lm_tokenizer.load(str(out)).layout == lm_tokenizer.load(str(FIXTURES / (verifier or family))).layout
  if verifier:  # bad input is refused in one line (it was a traceback): once is enough, on the mixed team
    for args, refusal in [(["--role=judge", f"--out={tmp_path / 'judge'}"],
                           "--role='judge' is not a role of this run; allowed: ['solver', 'verifier']"),
                          (["--role=verifier", f"--out={out}"], f"--out={out} holds ['config.json', "),
                          (["--role=verifier", f"--out={workdir}"], f"--out={workdir} holds ['checkpoints', ")]:
      refused = subprocess.run([sys.executable, "-m", "marl_jax.tools.lm_export", f"--workdir={workdir}", *args],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
      assert refused.returncode == 1 and "Traceback" not in refused.stderr
      assert refused.stderr.strip().splitlines()[-1].startswith(f"python -m marl_jax.tools.lm_export: {refusal}")
  _, exported = hf_checkpoint.load(str(out))
  _, base = hf_checkpoint.load(str(FIXTURES / (verifier or family)))
  exported_config = json.loads((out / "config.json").read_text())
  source_config = json.loads((FIXTURES / (verifier or family) / "config.json").read_text())
  # What a server reads beside the weights (without the token ids transformers falls back to its
  # class defaults) is the source's.
  for key in ("model_type", *hf_checkpoint.SERVING_KEYS):
    assert exported_config.get(key) == source_config.get(key), key
  changed = {"/".join(str(k.key) for k in path): not np.allclose(a, b) for (path, a), b in
             zip(jax.tree_util.tree_leaves_with_path(exported), jax.tree.leaves(base))}
  if lora:  # the adapters of every target projection merged in; the rest is the frozen base
    assert changed and all(v == any(t in k for t in lora_lib.TARGETS) for k, v in changed.items())
  else:  # warm start and RL moved every tensor of the verifier's set
    assert all(changed.values())
