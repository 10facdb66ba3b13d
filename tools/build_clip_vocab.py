"""Rebuild app/resources/tokenizers/clip/{vocab.json,merges.txt} from CLIP's published BPE file.

The BPE file (bpe_simple_vocab_16e6.txt.gz) ships in the open_clip_torch wheel on PyPI, under the
MIT license kept beside the output. CLIP builds its 49408-token vocabulary from it: the 256 byte
symbols, the same with an end-of-word mark, one token per merge, then the two special tokens.
Usage: python tools/build_clip_vocab.py path/to/bpe_simple_vocab_16e6.txt.gz
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "app" / "resources" / "tokenizers" / "clip"
MERGES = 49152 - 256 - 2


def byte_symbols() -> list[str]:
    """The printable stand-in character for each byte value, in byte order (GPT-2's scheme)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    # CLIP orders the vocabulary printable bytes first, then the remapped ones.
    return [symbols[b] for b in printable] + [symbols[b] for b in range(256) if b not in printable]


def main(bpe_path: str) -> None:
    with gzip.open(bpe_path, "rt", encoding="utf-8") as bpe:
        lines = bpe.read().split("\n")
    merges = lines[1 : MERGES + 1]
    vocab = byte_symbols()
    vocab += [s + "</w>" for s in vocab]
    vocab += ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408, len(vocab)
    (OUT / "vocab.json").write_text(
        json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False), encoding="utf-8"
    )
    (OUT / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
