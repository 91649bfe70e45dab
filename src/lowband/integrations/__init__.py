"""Integrations with the trainers people use; each imports its library, so none is imported by `import lowband`:
`hf` (Hugging Face's Trainer, `pip install lowband[hf]`), `lightning` (Lightning's Trainer,
`pip install lowband[lightning]`), and `world`, what they share (torchrun's workers, a wrap for a trainer
that calls its own model)."""
