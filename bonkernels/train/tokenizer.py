"""Tokenizers the driver uses: a character-level one built offline, and a wrapper for local HF ones.

Both expose the same small interface: ``encode(text) -> list[int]`` (no special tokens),
``decode(ids) -> str`` (special tokens dropped), ``pad_id``, ``eos_id``, ``bos_id`` (or None),
``vocab_size`` and ``save(directory)``.
"""

from __future__ import annotations

import json
import os

CHAR_TOKENIZER_FILE = "bonkernels_tokenizer.json"
_SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """One token per character: three specials, then printable ASCII, newline and tab.

    Built from nothing, so the built-in models need no download. Characters outside the
    alphabet are encoded as '?' (a few HumanEval prompts use '≤' or '➞'); decode drops specials.
    """

    def __init__(self, alphabet: str | None = None):
        if alphabet is None:
            alphabet = "".join(chr(c) for c in range(32, 127)) + "\n\t"
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("the alphabet has repeated characters")
        self.alphabet = alphabet
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.unknown_id = self._index_of(alphabet, "?")
        self._index = {ch: i + len(_SPECIALS) for i, ch in enumerate(alphabet)}
        self.vocab_size = len(_SPECIALS) + len(alphabet)

    @staticmethod
    def _index_of(alphabet: str, ch: str) -> int:
        return len(_SPECIALS) + alphabet.index(ch) if ch in alphabet else len(_SPECIALS)

    def encode(self, text: str) -> list[int]:
        return [self._index.get(ch, self.unknown_id) for ch in text]

    def decode(self, ids) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i >= len(_SPECIALS):
                out.append(self.alphabet[i - len(_SPECIALS)])
        return "".join(out)

    def save(self, directory: str) -> None:
        with open(os.path.join(directory, CHAR_TOKENIZER_FILE), "w") as f:
            json.dump({"kind": "char", "alphabet": self.alphabet}, f)

    @classmethod
    def load(cls, directory: str) -> "CharTokenizer":
        with open(os.path.join(directory, CHAR_TOKENIZER_FILE)) as f:
            data = json.load(f)
        return cls(data["alphabet"])


class HFTokenizer:
    """A Hugging Face tokenizer read from a local directory (never from the hub)."""

    def __init__(self, directory: str):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.eos_id = self._tok.eos_token_id
        if self.eos_id is None:
            raise ValueError(f"the tokenizer in {directory} has no eos token")
        self.pad_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_id
        self.bos_id = self._tok.bos_token_id
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, directory: str) -> None:
        self._tok.save_pretrained(directory)


def load_tokenizer(directory: str):
    """The tokenizer stored in a checkpoint directory: ours if present, else the HF one."""
    if os.path.exists(os.path.join(directory, CHAR_TOKENIZER_FILE)):
        return CharTokenizer.load(directory)
    return HFTokenizer(directory)
