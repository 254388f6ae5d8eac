"""Speed of a language-model agent: prefill, decode and one update pass, each against a bound measured
in the same run, optionally beside the same work through `transformers` (a benchmark script, not a test).

  python -m marl_jax.tools.lm_bench --checkpoint=DIR [--random_weights] --batch=32 --prompt=160 --answer=160
  python -m marl_jax.tools.lm_bench --shapes=qwen3-0.6b --batch=8 --prompt=160 --answer=160 --peer=transformers
  python -m marl_jax.tools.lm_bench --shapes=qwen3-0.6b --rows update   # some of the rows only

One agent over its checkpoint's whole vocabulary (`lm.agent.from_config` with `free_text`, as a
word-problem run's) answers `--batch` prompts of `--prompt` random tokens with `--answer` sampled
tokens, on a single agent's canvas: the prompt, the turn's one-token header, the message.  Rows:

- prefill: `sampling.generate` with a one-token message: the prompt and header read, the first token
  sampled (the time to the first token);
- decode: `sampling.generate` with the whole message, less the prefill row's time: the other
  answer - 1 tokens, each sampled after reading the last;
- update: the trainer's value and gradient of its loss (`update.minibatch_gradient`: PPO-clip at
  `config.rl`'s defaults, its entropy computed) over `--batch` whole canvases, `--microbatch` rows
  at a time, as `config.rl.microbatch_size` splits a minibatch;
- step (two rows, not in the default set): one decode token, the program the message loop runs per
  token (`model.apply` of one token with the cache, the cache donated as the loop's carry is, the
  parameters as `model.rollout_params` makes them once per rollout), at the message's first position
  (`step_first`, after the prompt and header) and at the canvas's last
  (`step_last`): what a token costs as the canvas fills.

Bounds, measured before and after the rows (their mean): prefill and update against the matmul of
`marl_jax.tools.throughput` (FLOP/s; the FLOPs each row needs, `needed_flops`), decode against memory (the
bytes each token must read, `decode_bytes`, at the rate of a jitted copy, `bounds.copy_bytes_per_s`).  Every
program is compiled before it is timed (`jax.jit(...).lower(...).compile()`), and each row's time is
the median of `--repeats` calls.

`--peer=transformers` times the same work through `transformers` in the same process after marl_jax's
rows (torch and transformers are imported only then: `pip install -e ".[peer]"`): the checkpoint's
`*ForCausalLM` (random weights with `--random_weights`), `generate` sampling from the whole
distribution (no top-k or top-p) with exactly `answer` new tokens, and forward and backward of the same
loss; torch's threads set to this process's cores, as many as XLA's CPU client uses.

`--shapes=qwen3-0.6b` benchmarks Qwen3-0.6B's shapes with random weights (`write_shapes`: its
config.json and a tokenizer of its 151 936 words, so no checkpoint is needed).
"""
import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from marl_jax import (cli, configs, experiment, files, model as model_lib, parallel, protocols, sampling, tasks, text,
                      update)
from marl_jax.lm import agent as lm_agent
from marl_jax.lm import hf_checkpoint
from marl_jax.lm import model as lm_model
from marl_jax.protocols import engine
from marl_jax.tools import bounds

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "tests", "fixtures",
                        "lm")
# Named shapes (`--shapes`): the fixture whose config.json and tokenizer they extend, and the sizes.
SHAPES = {"qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                       num_key_value_heads=8, head_dim=128, num_hidden_layers=28,
                                       layer_types=["full_attention"] * 28, vocab_size=151936,
                                       max_position_embeddings=40960))}
PEERS = ("transformers",)
ROWS = ("prefill", "decode", "update", "step")
# The table's rows of each flag value: `step` times one token at two canvas positions.
TABLE_ROWS = {"prefill": ("prefill",), "decode": ("decode",), "update": ("update",), "step": ("step_first", "step_last")}


def write_shapes(name: str, directory: str) -> str:
  """A checkpoint directory of `SHAPES[name]` for random weights: the fixture's config.json with the
  sizes, and its tokenizer with unreachable words added up to the vocabulary (a free-text agent's
  policy and a word-problem run's log-softmax span the whole vocabulary, as with the real tokenizer;
  the fixture's encodes every text as before).  Returns `directory`."""
  fixture, sizes = SHAPES[name]
  with open(os.path.join(FIXTURES, fixture, "config.json")) as f:
    config = json.load(f) | sizes
  with open(os.path.join(FIXTURES, fixture, "tokenizer.json")) as f:
    tokenizer = json.load(f)
  vocab = tokenizer["model"]["vocab"]
  vocab.update({f"<unused_word_{i}>": i for i in range(len(vocab), config["vocab_size"])})
  os.makedirs(directory, exist_ok=True)
  for file, content in (("config.json", config), ("tokenizer.json", tokenizer)):
    files.write_atomically(os.path.join(directory, file), json.dumps(content, indent=1))
  return directory


@dataclasses.dataclass(frozen=True)
class Canvas(tasks.Task):
  """The benchmark's canvas: a prompt of `prompt` tokens, then one message of `answer` in free text.
  It poses no problems (the benchmark writes random prompts); only its layout is read."""
  free_text: ClassVar[bool] = True
  prompt: int = 1
  answer: int = 1

  @property
  def prompt_len(self) -> int:
    return self.prompt

  @property
  def answer_len(self) -> int:
    return self.answer


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every row reads: the agent, its canvas for each message length, the trainer's experiment."""
  exp: experiment.Experiment  # the single agent's experiment, on the whole canvas
  prefill_layout: engine.Layout  # the same canvas with a one-token message
  batch: int
  prompt: int
  answer: int

  @property
  def lm(self) -> lm_model.LMConfig:
    return self.exp.model.lm


def make_setup(checkpoint: str, random_weights: bool, batch: int, prompt: int, answer: int, microbatch: int,
               dtype: str, cache_block: int | None = None) -> Setup:
  """Every flag checked and every static piece built, before anything compiles; a bad value is a
  ValueError naming its flag and what is allowed."""
  for flag, value, low in (("batch", batch, 1), ("prompt", prompt, 1), ("answer", answer, 2),
                           ("microbatch", microbatch, 1), ("cache_block", 1 if cache_block is None else cache_block, 1)):
    if value < low:
      raise ValueError(f"--{flag}={value}; allowed: an integer >= {low}")
  if batch % microbatch:
    raise ValueError(f"--microbatch={microbatch} does not divide --batch={batch}; allowed: its divisors")
  try:
    hf = hf_checkpoint.read_hf_config(checkpoint)
  except (OSError, ValueError) as e:
    raise ValueError(f"--checkpoint={checkpoint!r}: {e}") from e
  length = prompt + 1 + answer  # the prompt, the turn's header, the message
  positions = hf.get("max_position_embeddings")
  if positions is not None and length > positions:
    raise ValueError(f"--prompt={prompt} and --answer={answer} make a canvas of {length} positions (with the "
                     f"turn's one-token header), more than the model's max_position_embeddings={positions}; "
                     f"allowed: --prompt + --answer <= {positions - 1}")
  c = configs.base_config()
  c.model.update(checkpoint=checkpoint, random_weights=random_weights, dtype=dtype, max_len=length)
  c.rl.update(batch_size=batch, group_size=1, minibatches=1, microbatch_size=microbatch)
  c.credit.baseline = "none"  # credit is not timed; a group of one row allows no other baseline
  c.num_devices = 1
  configs.fit_canvas(c)  # the default task's canvas too, which the experiment is built on
  try:
    exp = experiment.build(c)  # the trainer's loss, optimiser and mesh, on the default task's canvas
    model = dataclasses.replace(lm_agent.from_config(c.model, free_text=True), cache_block=cache_block)
  except ValueError as e:  # names config.model.* keys, which the flags set
    raise ValueError(f"{e} (from --checkpoint, --random_weights, --dtype)") from e
  task = Canvas(prompt=prompt, answer=answer)
  protocol = protocols.make("single", task)
  exp = dataclasses.replace(exp, task=task, protocol=protocol, layout=protocol.layout(task, (0,)), model=model)
  short = Canvas(prompt=prompt, answer=1)
  return Setup(exp, protocols.make("single", short).layout(short, (0,)), batch, prompt, answer)


def prompt_tokens(setup: Setup, key) -> np.ndarray:
  """prompt_BxP: random ordinary words of the vocabulary (canvas values past the engine's symbols)."""
  model = setup.exp.model
  return np.asarray(jax.random.randint(key, (setup.batch, setup.prompt), text.VOCAB_SIZE, model.num_writable))


def needed_flops(lm: lm_model.LMConfig, reads, logits: int) -> int:
  """Forward FLOPs (a multiply-add is 2) of reading canvas positions `reads`, each attending to the
  keys at or before it, with the unembedding at `logits` of them: the least any implementation
  computes (`lm.model.flops_per_token` of each position at its own context)."""
  body = dataclasses.replace(lm, vocab_size=0)
  unembedding = lm_model.flops_per_token(lm, 0) - lm_model.flops_per_token(body, 0)
  return sum(lm_model.flops_per_token(body, p + 1) for p in reads) + logits * unembedding


def row_flops(setup: Setup) -> dict[str, int]:
  """FLOPs of each compute-bound row over the batch (`needed_flops`): prefill reads the prompt and
  header for the first token's logits; the update reads every position forward and backward (2x)
  with the logits of the `answer` positions that predict the message."""
  P, N, B = setup.prompt, setup.answer, setup.batch
  return {"prefill": B * needed_flops(setup.lm, range(P + 1), 1),
          "update": 3 * B * needed_flops(setup.lm, range(P + 1 + N), N)}


def token_bytes(setup: Setup, weight_count: int, position: int) -> int:
  """Bytes reading one token at canvas `position` must read: every weight once at the compute dtype's
  width (the embedding's rows aside, unless it is the unembedding too) and the keys and values of
  every position written so far, its own included, for the batch."""
  lm = setup.lm
  width = jnp.dtype(lm.dtype).itemsize
  if not lm.tie_word_embeddings:
    weight_count -= lm.vocab_size * lm.hidden_size
  per_position = 2 * lm.num_hidden_layers * lm.num_key_value_heads * lm.head_dim * width * setup.batch
  return weight_count * width + (position + 1) * per_position


def decode_bytes(setup: Setup, weight_count: int) -> int:
  """Bytes the decode row must read: `token_bytes` of each of the answer - 1 tokens read."""
  P, N = setup.prompt, setup.answer
  return sum(token_bytes(setup, weight_count, p) for p in range(P + 1, P + N))


def step_positions(setup: Setup) -> dict[str, int]:
  """The canvas position each step row reads: the message's first token, the canvas's last."""
  return {"step_first": setup.prompt + 1, "step_last": setup.exp.layout.length - 1}


def median_seconds(call, repeats: int) -> float:
  """The median wall time of `repeats` calls of `call`, each waited for."""
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


def marl_jax_rows(setup: Setup, rows: tuple[str, ...], repeats: int, seed: int = 0) -> tuple[dict, int]:
  """Seconds and tokens of each of `rows` through marl_jax, and the parameter count."""
  exp, B = setup.exp, setup.batch
  key_params, key_prompt, key_sample, key_update = jax.random.split(jax.random.PRNGKey(seed), 4)
  params_R = model_lib.pretrained_stack(exp.model, 1)
  if params_R is None:
    params_R = jax.jit(model_lib.init_stack, static_argnums=(0, 2))(exp.model, key_params, 1)
  params_R = jax.device_put(params_R)
  prompt_BxP = prompt_tokens(setup, key_prompt)
  key_B = jax.random.split(key_sample, B)
  seconds, sampled = [], []
  for layout in generations(setup, rows, (setup.prefill_layout, exp.layout)):
    canvas_BxT = jnp.pad(prompt_BxP, ((0, 0), (0, layout.length - setup.prompt)), constant_values=text.PAD)
    force_BxT = jnp.zeros(canvas_BxT.shape, bool)
    # Every output returned: the sampled mask alone would let XLA drop a one-token message's prefill.
    sample = jax.jit(lambda p, c, k, layout=layout: sampling.generate(
        exp.model, layout, p, c, force_BxT, k, exp.config.rl.temperature))
    compiled = sample.lower(params_R, canvas_BxT, key_B).compile()
    seconds.append(median_seconds(lambda: compiled(params_R, canvas_BxT, key_B), repeats))
    sampled.append(int(compiled(params_R, canvas_BxT, key_B)[2].sum()))
  timed = prefill_and_decode(setup, seconds, sampled[-1] - sampled[0] if sampled else 0)
  if "update" in rows:
    mb = update_batch(setup, prompt_BxP, key_update)
    gradient = jax.jit(parallel.shard_map(lambda p, b: update.minibatch_gradient(exp, p, b, 1)[:2], exp.mesh,
                                          in_specs=P(), out_specs=P()))
    compiled = gradient.lower(params_R, mb).compile()
    timed["update"] = {"seconds": median_seconds(lambda: compiled(params_R, mb), repeats),
                       "tokens": B * exp.layout.length}
  if "step" in rows:
    timed |= step_rows(setup, params_R, prompt_BxP, repeats)
  return timed, model_lib.count_params(params_R)


def step_rows(setup: Setup, params_R, prompt_BxP, repeats: int) -> dict:
  """One decode token at each of `step_positions`: one compiled program (the position traced, as in
  the message loop), reading the parameters as a rollout holds them (`model.rollout_params`, made
  once, outside the timed calls), its cache donated and handed back from call to call."""
  model, B, T = setup.exp.model, setup.batch, setup.exp.layout.length
  params = jax.jit(lambda p: model_lib.rollout_params(model, model_lib.take_sets(model, p, 0)))(params_R)
  token_Bx1, key_ok_BxT = jnp.asarray(prompt_BxP[:, :1]), jnp.ones((B, T), bool)
  step = jax.jit(lambda p, c, t: model_lib.apply(model, p, token_Bx1, t, key_ok_BxT, c, readout_M=np.array([0])),
                 donate_argnums=1)
  cache = [model_lib.empty_cache(model, B, T)]
  compiled = step.lower(params, cache[0], jnp.int32(0)).compile()
  timed = {}
  for name, position in step_positions(setup).items():
    def call(position=position):
      logits_Bx1xV, cache[0] = compiled(params, cache[0], jnp.int32(position))
      return logits_Bx1xV
    timed[name] = {"seconds": median_seconds(call, repeats), "tokens": B}
  return timed


def generations(setup: Setup, rows: tuple[str, ...], lengths: tuple) -> tuple:
  """The generations `rows` need, of `lengths` (one token, the whole answer): none without prefill or
  decode, the first alone for prefill, both for decode (the whole answer less the first token)."""
  return lengths[:("prefill" in rows or "decode" in rows) + ("decode" in rows)]


def prefill_and_decode(setup: Setup, seconds: list[float], decoded: int) -> dict:
  """The prefill row from a generation of one token (the time to the first token: the prompt and
  header read) and, with a second, the decode row from one of the whole answer less it (`decoded`
  tokens sampled after the first: B x (answer - 1) unless a row wrote its end-of-turn token)."""
  timed = {"prefill": {"seconds": seconds[0], "tokens": setup.batch * (setup.prompt + 1)}} if seconds else {}
  if len(seconds) == 2:
    timed["decode"] = {"seconds": seconds[1] - seconds[0], "tokens": decoded}
  return timed


def update_batch(setup: Setup, prompt_BxP, key) -> update.Batch:
  """B whole canvases for the update: the prompt, the header, a message of random words sampled by
  role 0 at log-prob log(1/words), advantages N(0, 1)."""
  exp, B, N = setup.exp, setup.batch, setup.answer
  layout = exp.layout
  key_message, key_adv = jax.random.split(key)
  message_BxN = jax.random.randint(key_message, (B, N), text.VOCAB_SIZE, exp.model.num_writable)
  tokens_BxT = jnp.concatenate([prompt_BxP, jnp.broadcast_to(layout.marker_T[setup.prompt], (B, 1)),
                                message_BxN], 1).astype(jnp.int32)
  sampled_BxT = jnp.broadcast_to(jnp.asarray(layout.author_T == 0), tokens_BxT.shape)
  return update.Batch(tokens_BxT=tokens_BxT,
                      old_logp_BxT=jnp.where(sampled_BxT, -math.log(exp.model.num_writable), 0.0),
                      ref_logp_BxT=None, adv_BxT=jnp.where(sampled_BxT, jax.random.normal(key_adv, (B, 1)), 0.0),
                      role_mask_BxRxT=sampled_BxT[:, None], group_B=jnp.arange(B))


def transformers_rows(setup: Setup, rows: tuple[str, ...], random_weights: bool, microbatch: int, repeats: int,
                      seed: int = 0) -> dict:
  """The same rows through `transformers` (torch, float32 or bfloat16 as `--dtype`): generate with one
  and with `answer` new tokens, sampled from the whole distribution, and forward and backward of the
  trainer's loss (PPO-clip, its entropy computed) over the same canvases, `microbatch` rows at a time."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  torch.manual_seed(seed)
  # On the accelerator marl_jax ran on, where torch sees one; each timed call waits for its kernels.
  device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
  synced = lambda call: lambda: (call(), torch.cuda.synchronize() if device == "cuda" else None)[0]
  exp, B = setup.exp, setup.batch
  directory = exp.model.checkpoint
  dtype = {jnp.dtype(jnp.float32): torch.float32, jnp.dtype(jnp.bfloat16): torch.bfloat16}[jnp.dtype(setup.lm.dtype)]
  if random_weights:
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(directory),
                                                          dtype=dtype)
  else:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
  model = model.to(device)
  ids_W = np.asarray(exp.model.canvas_ids_V)
  key_prompt, _, _, key_update = jax.random.split(jax.random.PRNGKey(seed), 4)
  prompt_BxP = prompt_tokens(setup, key_prompt)
  header = exp.layout.marker_T[setup.prompt]
  input_ids = torch.as_tensor(ids_W[np.concatenate([prompt_BxP, np.full((B, 1), header)], 1)], device=device)
  eos = ids_W[text.EOS]

  def generate(new_tokens: int):
    with torch.inference_mode():
      return model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                            top_k=0, top_p=1.0, temperature=exp.config.rl.temperature,
                            min_new_tokens=new_tokens, max_new_tokens=new_tokens, eos_token_id=int(eos),
                            pad_token_id=int(eos))

  generate(2)  # warm-up: torch allocates and picks its kernels on the first call
  timed = prefill_and_decode(setup, [median_seconds(synced(lambda n=n: generate(n)), repeats)
                                     for n in generations(setup, rows, (1, setup.answer))], B * (setup.answer - 1))
  if "update" not in rows:
    return timed

  mb = jax.tree.map(np.array, update_batch(setup, prompt_BxP, key_update))  # writable copies for torch
  rl = exp.config.rl
  tokens = torch.as_tensor(ids_W[mb.tokens_BxT], device=device)
  old_logp, adv = torch.as_tensor(mb.old_logp_BxT, device=device), torch.as_tensor(mb.adv_BxT, device=device)
  mask = torch.as_tensor(mb.role_mask_BxRxT[:, 0], dtype=torch.float32, device=device)
  count = mask.sum()

  def loss_and_grad():
    """update.role_losses' PPO-clip loss (the entropy term at config.rl.entropy_coef), summed over
    the sampled tokens over their count, backward `microbatch` rows at a time."""
    model.zero_grad(set_to_none=True)
    for rows_slice in np.split(np.arange(B), B // microbatch):
      logits = model(input_ids=tokens[rows_slice]).logits[:, :-1].float()
      logp_all = torch.log_softmax(logits / rl.temperature, -1)
      logp = logp_all.gather(-1, tokens[rows_slice, 1:, None])[..., 0]
      entropy = -(logp_all.exp() * logp_all).sum(-1)
      ratio = torch.exp(logp - old_logp[rows_slice, 1:])
      a = adv[rows_slice, 1:]
      per_token = -torch.minimum(ratio * a, ratio.clamp(1 - rl.clip_eps, 1 + rl.clip_eps) * a)
      per_token = per_token - rl.entropy_coef * entropy
      ((per_token * mask[rows_slice, 1:]).sum() / count).backward()

  loss_and_grad()  # warm-up
  timed["update"] = {"seconds": median_seconds(synced(loss_and_grad), repeats), "tokens": B * exp.layout.length}
  return timed


def table(rows: list[dict], header: dict) -> str:
  """The rows as one markdown table, with the bounds above it."""
  peer = any("peer_tokens_per_s" in row for row in rows)
  lines = [f"{header['model']}, batch {header['batch']}, prompt {header['prompt']}, answer {header['answer']}, "
           f"{header['dtype']}, {header['device']}, huge pages {'on' if header['huge_pages'] else 'off'}, "
           f"KV cache in blocks of {header['cache_block']} positions; "
           f"matmul bound {header['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s "
           f"({', '.join(f'{x / 1e9:.0f}' for x in header['matmul_readings'])}), copy "
           f"{header['copy_bytes_per_s'] / 1e9:.1f} GB/s "
           f"({', '.join(f'{x / 1e9:.1f}' for x in header['copy_readings'])})", ""]
  columns = ["row", "tokens", "seconds", "tokens/s", "rate", "of bound"]
  if peer:
    columns += ["transformers s", "transformers tokens/s", "of bound", "marl_jax / transformers"]
  lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for row in rows:
    unit, scale = ("GB/s", 1e9) if row["bound"] == "bytes" else ("GFLOP/s", 1e9)
    cells = [row["row"], f"{row['tokens']}", f"{row['seconds']:.3g}", f"{row['tokens_per_s']:.1f}",
             f"{row['rate'] / scale:.1f} {unit}", f"{row['of_bound']:.2f}"]
    if peer and "ratio" in row:
      cells += [f"{row['peer_seconds']:.3g}", f"{row['peer_tokens_per_s']:.1f}", f"{row['peer_of_bound']:.2f}",
                f"{row['ratio']:.2f}"]
    elif peer:  # a row the peer does not time (step)
      cells += ["–"] * 4
    lines.append("| " + " | ".join(cells) + " |")
  seconds = {row["row"]: row["seconds"] for row in rows}
  if {"step_first", "step_last"} <= set(seconds):
    lines += ["", f"One token at the canvas's last position costs {seconds['step_last'] / seconds['step_first']:.2f}x "
              f"one at the message's first."]
  return "\n".join(lines)


def measure(setup: Setup, rows: tuple[str, ...], random_weights: bool, microbatch: int, repeats: int,
            peer: str) -> tuple[list, dict]:
  """Each of `rows` (and the peer's), with the bounds measured before and after them."""
  matmul_readings, copy_readings = [bounds.matmul_flops_per_s()], [bounds.copy_bytes_per_s()]
  ours, weight_count = marl_jax_rows(setup, rows, repeats)
  theirs = transformers_rows(setup, rows, random_weights, microbatch, repeats) if peer else None
  matmul_readings.append(bounds.matmul_flops_per_s())
  copy_readings.append(bounds.copy_bytes_per_s())
  matmul, copy = float(np.mean(matmul_readings)), float(np.mean(copy_readings))
  flops = row_flops(setup)  # the compute-bound rows; the others are bound by the bytes they read
  work = flops | {"decode": decode_bytes(setup, weight_count)} | {
      name: token_bytes(setup, weight_count, position) for name, position in step_positions(setup).items()}
  table_rows = []
  for name in [name for flag in ROWS if flag in rows for name in TABLE_ROWS[flag]]:
    bound, per_s = ("flops", matmul) if name in flops else ("bytes", copy)
    row = {"row": name, "bound": bound, "work": work[name], **ours[name]}
    row |= {"tokens_per_s": row["tokens"] / row["seconds"], "rate": work[name] / row["seconds"],
            "of_bound": work[name] / per_s / row["seconds"]}
    if theirs and name in theirs:
      peer_s = theirs[name]["seconds"]
      row |= {"peer_seconds": peer_s, "peer_tokens_per_s": theirs[name]["tokens"] / peer_s,
              "peer_of_bound": work[name] / per_s / peer_s}
      row["ratio"] = row["tokens_per_s"] / row["peer_tokens_per_s"]
    table_rows.append(row)
  header = {"batch": setup.batch, "prompt": setup.prompt, "answer": setup.answer,
            "dtype": jnp.dtype(setup.lm.dtype).name, "device": bounds.device_name(),
            "huge_pages": bounds.huge_pages(), "matmul_flops_per_s": matmul,
            "matmul_readings": matmul_readings, "copy_bytes_per_s": copy, "copy_readings": copy_readings,
            "params": weight_count, "microbatch": microbatch, "repeats": repeats, "peer": peer,
            "backend": jax.default_backend(), "cache_block": cache_block_width(setup)}
  return table_rows, header


def cache_block_width(setup: Setup) -> int:
  """Canvas positions in the first block of the rollout's KV cache (`LMAgent.empty_cache`)."""
  layer_cache = jax.eval_shape(lambda: setup.exp.model.empty_cache(1, setup.exp.layout.length))[0]
  return layer_cache[0]["v"].shape[lm_model.POSITION_AXIS["v"]]


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m marl_jax.tools.lm_bench", description=__doc__.split("\n")[0])
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument("--checkpoint", help="a local Qwen3/Llama checkpoint directory (config.json, "
                      "tokenizer.json and, without --random_weights, its weights)")
  source.add_argument("--shapes", choices=sorted(SHAPES), help="named shapes with random weights "
                      "(write_shapes), instead of --checkpoint")
  p.add_argument("--random_weights", action="store_true", help="with --checkpoint: its shapes, randomly "
                 "initialised (only config.json and tokenizer.json are read)")
  p.add_argument("--batch", type=int, default=32, help="rows sampled and trained at once")
  p.add_argument("--prompt", type=int, default=160, help="prompt tokens of each row")
  p.add_argument("--answer", type=int, default=160, help="tokens each row samples (exactly these many)")
  p.add_argument("--microbatch", type=int, default=1, help="rows per forward and backward pass of the "
                 "update (config.rl.microbatch_size); must divide --batch")
  p.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"),
                 help="compute dtype (config.model.dtype)")
  p.add_argument("--cache_block", type=int, help="canvas positions per block of the rollout's KV cache "
                 "(a decode step reads the blocks written so far); default: the agent's, "
                 f"{lm_agent.CPU_CACHE_BLOCK} on CPU, the whole canvas elsewhere")
  p.add_argument("--repeats", type=int, default=3, help="timed calls per row; each row is their median")
  p.add_argument("--rows", nargs="+", choices=ROWS, default=["prefill", "decode", "update"],
                 help="the rows to time (decode times the prefill's generation too; step: one decode token at "
                 "the message's first position and at the canvas's last)")
  p.add_argument("--peer", choices=PEERS, help="also time the same work through this library")
  p.add_argument("--out", help="also write the rows and bounds here as JSON")
  return p


def main(argv=None) -> None:
  p = parser()
  args = p.parse_args(argv)
  with cli.refusing_bad_input(p):
    if args.repeats < 1:
      raise ValueError(f"--repeats={args.repeats}; allowed: an integer >= 1")
    if args.random_weights and args.shapes:
      raise ValueError("--random_weights is for --checkpoint; --shapes always uses random weights")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
      raise ValueError(f"--out={args.out}: its directory does not exist; allowed: a file in one that does")
    scratch = tempfile.mkdtemp() if args.shapes else None
    try:
      checkpoint = write_shapes(args.shapes, scratch) if args.shapes else args.checkpoint
      setup = make_setup(checkpoint, args.random_weights or bool(args.shapes), args.batch, args.prompt,
                         args.answer, args.microbatch, args.dtype, args.cache_block)
      rows, header = measure(setup, tuple(args.rows), args.random_weights or bool(args.shapes), args.microbatch,
                             args.repeats, args.peer)
    finally:
      if scratch:
        shutil.rmtree(scratch)
  header["model"] = args.shapes or args.checkpoint
  print(table(rows, header), flush=True)
  if args.out:
    files.write_atomically(args.out, json.dumps({"header": header, "rows": rows}, indent=1))


if __name__ == "__main__":
  main(sys.argv[1:])
