"""Qwen3/Llama-family checkpoints: the decoder, loading and saving local files, the tokenizer, and word
problems posed to them."""
