"""Integrations with the trainers people use; each imports its library, so none is imported by `import lowband`:
`lowband.integrations.hf` (Hugging Face's Trainer, `pip install lowband[hf]`)."""
