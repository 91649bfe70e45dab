"""Your own language model through `lowband train` and `lowband compare`: a Hugging Face GPT-2 built from
a config (no download), as a `package.module:factory` string.

    lowband train --dataset text --model examples.own_model:gpt2 --method sparseloco --workers 2 --epochs 1 \\
        --set data.max_bytes=200000 --set 'model.kwargs={n_layer=2, n_embd=64}'
    lowband compare --suite lm --methods allreduce,sparseloco --set model.name='examples.own_model:gpt2'

For text the factory is also given `vocab_size` (256 byte values) and `context` (the window, data.context)
when it names them; a model whose output carries `.logits` (a transformers ModelOutput) trains as its
logits. Run from the repository's root (or put the module on PYTHONPATH).
"""

from __future__ import annotations


def gpt2(in_shape, num_classes, vocab_size: int, context: int, n_layer: int = 2, n_head: int = 2, n_embd: int = 64):
    """transformers' GPT2LMHeadModel from a GPT2Config: randomly initialised, nothing downloaded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=context, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                        bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1)
    return GPT2LMHeadModel(config)
