#!/usr/bin/python3
"""A token file of uniformly random ids for the benchmarks (make bench): /tokens uint16 with the
vocabulary size, end-of-text id and tokenizer name a GPT-2 token file records.

  random_tokens.py OUT.h5 VOCAB [COUNT]    COUNT ids (200000), seeded: the same file every time
"""
import sys

import h5py
import numpy as np


def main(path, vocab, count=200_000):
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, vocab, count, dtype=np.uint16))
        f.attrs["vocab_size"] = np.int64(vocab)
        f.attrs["eot"] = np.int64(vocab - 1)
        f.attrs["tokenizer"] = np.bytes_("gpt2")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:4]))
