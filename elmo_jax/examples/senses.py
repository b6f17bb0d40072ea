"""Word senses in ELMo layers: "bank" among money words and among river words, and a picture of
"bank", "bass" and "current" in every layer.

    python -m elmo_jax.examples.senses --workdir=workdirs/demo [--png=senses.png]

embeds "bank" in demo-corpus sentences whose other words belong to the money topic or to the
river topic, and prints, per layer, the mean cosine similarity of its vectors within a sense and
across senses. The token layer has no context, so every "bank" is the same vector there; the
LSTM layers see the sentence. With matplotlib (pip install 'elmo_jax[plot]') it also draws
"bank" (money / river), "bass" (music / river) and "current" (river / money) in 48 sentences
each, every layer's vectors projected to their first two principal components, coloured by the
sense the sentence gives the noun.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

from elmo_jax.embed import Embedder
from elmo_jax.model_io import load_model
from elmo_jax.outputs import replacing
from elmo_jax.text.demo_corpus import AMBIGUOUS_NOUNS, grammar

# "the ADJ bank VERB ADV ." is a demo-corpus template: the adjective before "bank" and the verb
# after it both belong to the sentence's topic, so both LMs see the sense at "bank".
TEMPLATE = "the {adjective} {noun} {verb} {adverb} ."
CUES = {
    "money": [("wealthy", "lends"), ("costly", "invests"), ("financial", "pays"), ("rich", "saves")],
    "river": [("muddy", "flows"), ("shallow", "floods"), ("grassy", "drifts"), ("rocky", "swims")],
}
PICTURED = ("bank", "bass", "current")
SENSE_COLOURS = {"money": "tab:green", "river": "tab:blue", "music": "tab:purple"}


def sense_similarities(embedder: Embedder, adverbs=("slowly", "quickly")) -> tuple[np.ndarray, np.ndarray]:
    """Mean cosine similarity per layer (L + 1,) of the "bank" vectors of two sentences with
    cues of the same sense, and of the other sense."""

    def cosine(a, b):
        return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))

    within, across = [], []
    for adverb in adverbs:
        vectors = {}
        for sense, cues in CUES.items():
            sentences = [TEMPLATE.format(adjective=a, noun="bank", verb=v, adverb=adverb).split() for a, v in cues]
            vectors[sense] = [out[:, 2] for out in embedder(sentences)]  # "bank" is token 2
        within += [cosine(a, b) for vs in vectors.values() for a, b in itertools.combinations(vs, 2)]
        across += [cosine(a, b) for a in vectors["money"] for b in vectors["river"]]
    return np.mean(within, axis=0), np.mean(across, axis=0)


def noun_vectors(embedder: Embedder, noun: str, per_sense: int = 24, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """(L + 1, n, 2P) vectors of `noun` in `per_sense` sentences of each of its senses, whose
    adjective and verb are drawn from the 20 most frequent of that topic; and each one's sense."""
    g, rng = grammar(), np.random.default_rng(seed)
    sentences, senses = [], []
    for sense in AMBIGUOUS_NOUNS[noun]:
        for _ in range(per_sense):
            adjective, verb = (str(rng.choice(g.categories[f"{c}:{sense}"][:20])) for c in ("ADJ", "VERB"))
            adverb = str(rng.choice(g.categories["ADV"]))
            sentences.append(TEMPLATE.format(adjective=adjective, noun=noun, verb=verb, adverb=adverb).split())
            senses.append(sense)
    return np.stack([out[:, 2] for out in embedder(sentences)], axis=1), senses


def principal_plane(x_ND: np.ndarray) -> np.ndarray:
    """(N, D) -> (N, 2): the coordinates on the first two principal components (0 where the
    vectors do not vary)."""
    centred = x_ND - x_ND.mean(axis=0)
    if np.allclose(centred, 0.0, atol=1e-6):
        return np.zeros((len(x_ND), 2))
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T


def draw_senses(embedder: Embedder, png: Path, title: str) -> None:
    from matplotlib.figure import Figure

    vectors = {noun: noun_vectors(embedder, noun) for noun in PICTURED}
    n_layers = next(iter(vectors.values()))[0].shape[0]
    figure = Figure(figsize=(3.3 * n_layers, 3.0 * len(PICTURED)), layout="constrained")
    grid = figure.subplots(len(PICTURED), n_layers, squeeze=False)
    for row, (noun, (x_LND, senses)) in enumerate(vectors.items()):
        for layer in range(n_layers):
            axes, xy = grid[row, layer], principal_plane(x_LND[layer])
            for sense in AMBIGUOUS_NOUNS[noun]:
                pick = [i for i, s in enumerate(senses) if s == sense]
                axes.scatter(xy[pick, 0], xy[pick, 1], s=14, alpha=0.7, color=SENSE_COLOURS[sense], label=sense)
            what = "token layer, no context: one point" if layer == 0 else f"LSTM layer {layer}"
            axes.set_title(f'"{noun}", {what}', fontsize="medium")
            axes.set_xticks([])
            axes.set_yticks([])
            if layer == 0:
                axes.legend(fontsize="small", loc="upper left")
    figure.suptitle(f"{title}: each point is the noun in one sentence, its layer's vectors on their first two "
                    "principal components")  # fmt: skip
    with replacing(png, overwrite=True) as tmp:
        figure.savefig(tmp, format="png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="workdirs/demo", help="a trained demo workdir")
    parser.add_argument("--png", default="senses.png", help="the picture (needs matplotlib); '' = none")
    args = parser.parse_args()
    model = load_model(args.workdir)
    embedder = Embedder(model, batch_size=8)
    within, across = sense_similarities(embedder)
    print('cosine similarity of "bank" vectors (money vs river contexts)')
    print("layer  same sense  other sense")
    for layer, (w, a) in enumerate(zip(within, across)):
        print(f"{layer:5d}  {w:10.3f}  {a:11.3f}")
    if args.png:
        try:
            draw_senses(Embedder(model, batch_size=48), Path(args.png), args.workdir)
            print(f"picture: {args.png}")
        except ImportError:
            print("no picture: it needs matplotlib (pip install 'elmo_jax[plot]')")


if __name__ == "__main__":
    main()
