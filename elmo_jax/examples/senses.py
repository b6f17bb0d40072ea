"""Word senses in ELMo layers: "bank" among money words and among river words.

    python -m elmo_jax.examples.senses --workdir=workdirs/demo

embeds "bank" in demo-corpus sentences whose other words belong to the money topic or to the
river topic, and prints, per layer, the mean cosine similarity of its vectors within a sense and
across senses. The token layer has no
context, so every "bank" is the same vector there; the LSTM layers see the sentence.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from elmo_jax.embed import Embedder
from elmo_jax.model_io import load_model

# "the ADJ bank VERB ADV ." is a demo-corpus template: the adjective before "bank" and the verb
# after it both belong to the sentence's topic, so both LMs see the sense at "bank".
TEMPLATE = "the {adjective} bank {verb} {adverb} ."
CUES = {
    "money": [("wealthy", "lends"), ("costly", "invests"), ("financial", "pays"), ("rich", "saves")],
    "river": [("muddy", "flows"), ("shallow", "floods"), ("grassy", "drifts"), ("rocky", "swims")],
}


def sense_similarities(embedder: Embedder, adverbs=("slowly", "quickly")) -> tuple[np.ndarray, np.ndarray]:
    """Mean cosine similarity per layer (L + 1,) of the "bank" vectors of two sentences with
    cues of the same sense, and of the other sense."""

    def cosine(a, b):
        return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))

    within, across = [], []
    for adverb in adverbs:
        vectors = {}
        for sense, cues in CUES.items():
            sentences = [TEMPLATE.format(adjective=a, verb=v, adverb=adverb).split() for a, v in cues]
            vectors[sense] = [out[:, 2] for out in embedder(sentences)]  # "bank" is token 2
        within += [cosine(a, b) for vs in vectors.values() for a, b in itertools.combinations(vs, 2)]
        across += [cosine(a, b) for a in vectors["money"] for b in vectors["river"]]
    return np.mean(within, axis=0), np.mean(across, axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="workdirs/demo", help="a trained demo workdir")
    args = parser.parse_args()
    model = load_model(args.workdir)
    within, across = sense_similarities(Embedder(model, batch_size=8))
    print('cosine similarity of "bank" vectors (money vs river contexts)')
    print("layer  same sense  other sense")
    for layer, (w, a) in enumerate(zip(within, across)):
        print(f"{layer:5d}  {w:10.3f}  {a:11.3f}")


if __name__ == "__main__":
    main()
