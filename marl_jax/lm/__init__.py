"""Qwen3/Llama-family checkpoints: the decoder, loading and saving local files, the tokenizer, low-rank
adapters per role over one shared base, and their sharding over devices."""
