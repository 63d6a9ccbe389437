"""Causal LMs for the driver: built-in tiny configurations, or a local Hugging Face checkpoint.

Built-in models are created from a ``transformers`` config with random weights (nothing is
downloaded) and use the character tokenizer. A local directory is loaded with
``from_pretrained(..., local_files_only=True)``; its tokenizer is ours when the directory has
``bonkernels_tokenizer.json`` (a model this driver exported), otherwise the directory's HF one.
"""

from __future__ import annotations

import os

import torch

from .tokenizer import CharTokenizer, load_tokenizer

# name -> (architecture, config fields); sizes chosen to train on a couple of CPU cores.
BUILTIN_MODELS = {
    "qwen2-tiny": ("qwen2", dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2)),
    "llama-tiny": ("llama", dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2)),
    "qwen2-micro": ("qwen2", dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)),
    "llama-micro": ("llama", dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)),
}


def build_builtin(name: str, tokenizer: CharTokenizer, max_positions: int = 4096):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    arch, fields = BUILTIN_MODELS[name]
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = config_cls(vocab_size=tokenizer.vocab_size, max_position_embeddings=max_positions,
                        tie_word_embeddings=True, pad_token_id=tokenizer.pad_id,
                        bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
                        attention_dropout=0.0, **fields)
    return model_cls(config)


def load_model(spec: str, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for a built-in name or a local checkpoint directory."""
    if spec in BUILTIN_MODELS:
        tokenizer = CharTokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_builtin(spec, tokenizer)
        return model.to(dtype), tokenizer
    if os.path.isdir(spec):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(spec, local_files_only=True, dtype=dtype)
        return model, load_tokenizer(spec)
    raise ValueError(f"--model {spec!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                     "nor a local checkpoint directory (nothing is downloaded at run time)")


def export_model(model, tokenizer, directory: str) -> None:
    """Write a loadable Hugging Face checkpoint directory (model + tokenizer)."""
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save(directory)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
