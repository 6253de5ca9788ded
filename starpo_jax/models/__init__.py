"""The policy model: transformer, Hugging Face import/export, tokenizers."""
