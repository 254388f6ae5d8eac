"""Builds the tiny checkpoints under tests/fixtures/lm/ that tests/lm_test.py checks marl_jax.lm against:
Qwen3 and Llama in their own chat layouts, and a SmolLM-style Llama that speaks ChatML.  Run by a
developer, never by tests or CI: it needs transformers and torch, which marl_jax does not depend on.

  python -m venv ~/venv-ref
  ~/venv-ref/bin/pip install transformers torch safetensors tokenizers
  ~/venv-ref/bin/python scripts/make_lm_fixture.py [FIXTURE ...]   # default: all of them

Each fixture gets a randomly initialised model saved by transformers itself (config.json and a bfloat16
model.safetensors, as real checkpoints are stored), a byte-level BPE tokenizer.json trained on a small
arithmetic corpus with its chat layout's tokens (and, where it has one, a tokenizer_config.json with
the chat template, checked to render the hand-written chat prompt), and reference.npz: the float32
logits transformers computes for a left-padded batch of prompts, and each prompt's greedy continuation.
"""
import json
import os
import random
import shutil
import sys

import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "lm")
VOCAB = 384
NEW_TOKENS = 8
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
CHATML_PROMPT = "<|im_start|>user\nWhat is 4 + 9?<|im_end|>\n<|im_start|>assistant\n"
FIXTURES = {
    "qwen3": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        chat=CHATML_PROMPT,
        config=lambda: transformers.Qwen3Config(
            **SHAPE, rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True)),
    "llama": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>"],
        chat=("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 4 + 9?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        # original_max_position_embeddings=64 puts head_dim 16's wavelengths in all three llama3 bands.
        config=lambda: transformers.LlamaConfig(
            **SHAPE, rms_norm_eps=1e-5, rope_theta=500_000.0, tie_word_embeddings=False,
            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=64))),
    # SmolLM-style: the Llama architecture (plain RoPE, tied embeddings) with ChatML turns, which only
    # the tokenizer files say (SmolLM2's template without its default system prompt).
    "llama_chatml": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        chat=CHATML_PROMPT,
        chat_template=("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                       "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                       "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
        config=lambda: transformers.LlamaConfig(
            **SHAPE, rms_norm_eps=1e-5, rope_theta=100_000.0, tie_word_embeddings=True)),
}
PROMPTS = ["What is 12 + 7?", "Tom has 3 apples and buys 5 more. How many apples does he have?"]


def corpus(n: int = 400) -> list[str]:
  rng = random.Random(0)
  names, things = ["Tom", "Ann", "Sam", "Mia"], ["apples", "pens", "coins", "books"]
  lines = []
  for _ in range(n):
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    who, what = rng.choice(names), rng.choice(things)
    lines += [f"What is {a} + {b}? The answer is {a + b}.",
              f"{who} has {a} {what} and buys {b} more. How many {what} does {who} have? {a + b}"]
  return lines


def train_tokenizer(specials: list[str]) -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(corpus(), trainer)
  return tok


def randomise(model: torch.nn.Module) -> None:
  """Weights large enough that attention is far from uniform (RoPE and masking then show in the
  logits), and norm scales away from 1 (so a misplaced one shows too)."""
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_((0.5 if "embed" in name else 0.15) * torch.randn(p.shape, generator=gen))


def reference(model, tok: tokenizers.Tokenizer, prompts: list[str]) -> dict:
  ids = [tok.encode(p, add_special_tokens=False).ids for p in prompts]
  P = max(map(len, ids))
  tokens_BxP = np.array([[0] * (P - len(x)) + x for x in ids], np.int64)  # left-padded
  mask_BxP = np.array([[False] * (P - len(x)) + [True] * len(x) for x in ids])
  with torch.no_grad():
    logits_BxPxV = model(torch.tensor(tokens_BxP), attention_mask=torch.tensor(mask_BxP).long()).logits
    continuation, margin = [], []
    for x in ids:  # each prompt alone, unpadded: the plainest reference for greedy decoding
      seq = torch.tensor([x])
      for _ in range(NEW_TOKENS):
        top2 = model(seq).logits[0, -1].topk(2)
        margin.append(float(top2.values[0] - top2.values[1]))
        seq = torch.cat([seq, top2.indices[:1][None]], 1)
      continuation.append(seq[0, len(x):].numpy())
  print(f"  prompt lengths {[len(x) for x in ids]}, logits std {float(logits_BxPxV.std()):.2f}, "
        f"smallest greedy top-2 margin {min(margin):.3g}")
  return dict(prompts_B=np.array(prompts), tokens_BxP=tokens_BxP.astype(np.int32), mask_BxP=mask_BxP,
              logits_BxPxV=np.where(mask_BxP[..., None], logits_BxPxV.float().numpy(), 0).astype(np.float32),
              continuation_BxN=np.stack(continuation).astype(np.int32))


def write_chat_template(tok: tokenizers.Tokenizer, template: str, chat: str, out: str) -> None:
  """tokenizer_config.json with `template`, which must render the chat prompt `chat` (one user turn,
  then the assistant's header) as transformers applies it."""
  hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template)
  rendered = hf_tok.apply_chat_template([{"role": "user", "content": "What is 4 + 9?"}], tokenize=False,
                                        add_generation_prompt=True)
  assert rendered == chat, (rendered, chat)
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"chat_template": template}, f, indent=2)


def main(names: list[str]):
  unknown = sorted(set(names) - set(FIXTURES))
  if unknown:
    raise SystemExit(f"unknown fixtures {unknown}; allowed: {sorted(FIXTURES)}")
  torch.manual_seed(0)
  for fixture in names or FIXTURES:
    spec = FIXTURES[fixture]
    out = os.path.join(OUT, fixture)
    shutil.rmtree(out, ignore_errors=True)
    tok = train_tokenizer(spec["specials"])
    config = spec["config"]()
    config.vocab_size = tok.get_vocab_size()
    model = transformers.AutoModelForCausalLM.from_config(config)
    randomise(model)
    model.to(torch.bfloat16).save_pretrained(out)
    for name in os.listdir(out):  # only what the loader reads
      if name not in ("config.json", "model.safetensors"):
        os.remove(os.path.join(out, name))
    tok.save(os.path.join(out, "tokenizer.json"))
    if "chat_template" in spec:
      write_chat_template(tok, spec["chat_template"], spec["chat"], out)
    # The reference reads the saved checkpoint back, in float32, with plain (eager) attention.
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                              attn_implementation="eager")
    print(f"{fixture}: vocab {tok.get_vocab_size()}")
    np.savez_compressed(os.path.join(out, "reference.npz"),
                        **reference(model.eval(), tok, PROMPTS + [spec["chat"]]))


if __name__ == "__main__":
  main(sys.argv[1:])
