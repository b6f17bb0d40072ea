"""ELMoForManyLangs' own Embedder on any model folder, for round trips (elmo_jax exports a model
in their layout; this says what their code computes from it). Runs ONLY in the side environment
of tests/reference/efml.py (`efml.embed` runs it); the project never imports it.

    python efml_embed.py MODEL_FOLDER SENTENCES.json OUT.hdf5 [BATCH_SIZE]

SENTENCES.json: a list of token lists. OUT.hdf5: dataset "i" = float32 (3, n_tokens_i,
2 * projection_dim), `Embedder(MODEL_FOLDER, BATCH_SIZE).sents2elmo(sentences, output_layer=-2)[i]`
with a fresh Embedder (zero initial state): the token layer [t | t], then each LSTM layer
[forward | backward], <bos> and <eos> removed. BATCH_SIZE defaults to 64, as theirs does; with
more sentences than that, their batch order is random (Python's `random`, seeded 0 here) and the
encoder's state carries from batch to batch.
"""

import json
import random
import sys
from pathlib import Path

# This folder holds the project's modules, which must not hide anything.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import logging  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
torch.manual_seed(0)

from elmoformanylangs import Embedder  # noqa: E402

logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)


def main(folder: Path, sentences_file: Path, out_file: Path, batch_size: int = 64) -> None:
    sentences = json.loads(sentences_file.read_text(encoding="utf-8"))
    random.seed(0)
    got = Embedder(str(folder), batch_size=batch_size).sents2elmo(sentences, output_layer=-2)
    with h5py.File(out_file, "w") as f:
        for i, value in enumerate(got):
            f.create_dataset(str(i), data=np.asarray(value, dtype=np.float32))
    print(f"efml_embed: {len(got)} sentences")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), *(int(a) for a in sys.argv[4:5]))
