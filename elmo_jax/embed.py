"""Sentences -> ELMo layers, for JAX pipelines (`Embedder`) and files (`embed_file`).

Each sentence gets `<S>` and `</S>`, runs through the biLM (`bilm_layers`, a pure function of
params, char ids and LSTM state) and comes back without its boundaries: (L + 1, n, 2P).
Stateless by default: every sentence starts from a zero state, so its vectors do not depend on
its batch. With `stateful=True`, row i of each batch continues from the state row i of the
previous batch left (as bilm-tf and AllenNLP do).

Memory is bounded by tokens, not rows: a stateless batch takes sentences (by length) while its
padded size stays within `max_tokens` positions, so a very long line runs alone, and the token
encoder runs over at most ENCODER_CHUNK tokens at a time.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from pathlib import Path
from typing import Iterator

import h5py
import jax
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.model.bilm import bilm_layers
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.token_encoder import encode_tokens as encode_token_vectors
from elmo_jax.model_io import Model
from elmo_jax.outputs import replacing
from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, CharTable, check_sentences
from elmo_jax.text.sources import read_lines
from elmo_jax.train.metrics import ProgressBar

LAYER_MODES = ("all", "top", "average")
log = logging.getLogger(__name__)


ENCODER_CHUNK = 2048  # tokens the char CNN encodes at once (its activations dominate memory)
MAX_TOKENS = 8192  # padded positions (rows x length) per stateless batch
MAX_SENTENCE_TOKENS = 100_000  # a longer line is refused: most likely not one sentence


def length_bucket(n: int) -> int:
    """Padded length for n positions: a multiple of 8, so few shapes get compiled."""
    return max(8, -(-n // 8) * 8)


def rows_bucket(n: int, batch_size: int) -> int:
    """Padded rows for n sentences: the next power of two, at most batch_size."""
    return min(batch_size, 1 << max(n - 1, 0).bit_length())


@functools.cache
def _jitted_layers(config: ModelConfig):
    return jax.jit(lambda params, chars, state: bilm_layers(params, chars, state, config, encoder_chunk=ENCODER_CHUNK))


class Embedder:
    """Tokenized sentences -> ELMo layers, one (L + 1, n, 2P) float32 numpy array each.

    Any number of sentences per call: stateless, they are sorted by length and batched (up to
    `batch_size` rows while rows x padded length stays within `max_tokens`); stateful,
    consecutive batches of `batch_size` rows, row i continuing from the state row i left.
    Results come back in input order.
    """

    def __init__(self, model: Model, batch_size: int = 64, stateful: bool = False, max_tokens: int = MAX_TOKENS):
        self.config, self.params = model.config, model.params
        self.batch_size, self.stateful, self.max_tokens = batch_size, stateful, max_tokens
        self.chars = CharTable(model.config.char_cnn.max_characters_per_token)
        self.state = LSTMState.zeros(model.config, batch_size)

    def char_ids(self, sentences: list[list[str]]) -> np.ndarray:
        """Sentences -> (rows, T, C) char ids with boundaries, padded slots all 0: rows is
        batch_size when stateful, else rows_bucket of the sentences."""
        T = length_bucket(max(len(s) for s in sentences) + 2)
        rows = self.batch_size if self.stateful else rows_bucket(len(sentences), self.batch_size)
        out = np.zeros((rows, T, self.chars.max_chars), np.int32)
        for i, s in enumerate(sentences):
            out[i, : len(s) + 2] = self.chars.encode([BOS_TOKEN, *s, EOS_TOKEN])
        return out

    def __call__(self, sentences: list[list[str]]) -> list[np.ndarray]:
        check_sentences(sentences)
        n = len(sentences)
        order = list(range(n)) if self.stateful else sorted(range(n), key=lambda i: len(sentences[i]))
        out: list[np.ndarray] = [None] * n  # type: ignore[list-item]
        lengths = [len(sentences[i]) for i in order]
        for start, end in _batches(lengths, self.batch_size, self.stateful, self.max_tokens):
            batch = order[start:end]
            for i, vectors in zip(batch, self.embed_batch([sentences[i] for i in batch])):
                out[i] = vectors
        return out

    def embed_batch(self, sentences: list[list[str]]) -> list[np.ndarray]:
        """1 to batch_size sentences, run as one batch -> one (L + 1, n, 2P) array each."""
        chars = self.char_ids(sentences)
        state = self.state if self.stateful else LSTMState.zeros(self.config, chars.shape[0])
        layers, _, state = _jitted_layers(self.config)(self.params, chars, state)
        if self.stateful:
            self.state = state
        layers = np.asarray(layers)
        return [layers[:, i, 1 : len(s) + 1] for i, s in enumerate(sentences)]


@functools.cache
def _jitted_token_encoder(config: ModelConfig):
    return jax.jit(lambda params, chars: encode_token_vectors(params, chars, config))


def token_embeddings(model: Model, words: list[str], batch_size: int = 4096) -> np.ndarray:
    """The context-independent token layer (n, P) of each word, like bilm-tf's
    dump_token_embeddings: a cache for vocabularies. Compiled once per model config and rows
    bucket (powers of two up to batch_size)."""
    table = CharTable(model.config.char_cnn.max_characters_per_token)
    encode = _jitted_token_encoder(model.config)
    out = []
    for start in range(0, len(words), batch_size):
        chunk = table.encode(words[start : start + batch_size])
        padded = np.zeros((rows_bucket(len(chunk), batch_size), chunk.shape[1]), np.int32)
        padded[: len(chunk)] = chunk
        out.append(np.asarray(encode(model.params["token_encoder"], padded))[: len(chunk)])
    return np.concatenate(out) if out else np.zeros((0, model.config.lstm.projection_dim), np.float32)


def _select(layers: np.ndarray, mode: str) -> np.ndarray:
    if mode == "all":
        return layers
    if mode == "top":
        return layers[-1]
    return layers.mean(axis=0)


def _batches(lengths: list[int], batch_size: int, stateful: bool, max_tokens: int) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive batches over sentences of these token counts (ascending
    unless stateful): stateful ones of batch_size rows; stateless ones as many (up to
    batch_size) as fit in max_tokens padded positions, at least one."""
    start = 0
    while start < len(lengths):
        end = start + 1
        while end < len(lengths) and end - start < batch_size:
            longest = lengths[end]  # ascending: the newest is the longest
            if not stateful and rows_bucket(end + 1 - start, batch_size) * length_bucket(longest + 2) > max_tokens:
                break
            end += 1
        yield start, end
        start = end


def embed_file(
    model: Model,
    input_path: str | Path,
    output_path: str | Path,
    layers: str = "all",
    batch_size: int = 64,
    stateful: bool = False,
    chunk_sentences: int = 4096,
    max_tokens: int = MAX_TOKENS,
    max_sentence_tokens: int = MAX_SENTENCE_TOKENS,
    overwrite: bool = False,
) -> int:
    """One whitespace-tokenized sentence a line -> HDF5 as `allennlp elmo` writes it: dataset
    "i" for line i, (L + 1, n, 2P) for `all` or (n, 2P) for `top` / `average`, plus
    `sentence_to_index`. Lines are read in chunks and, unless stateful, sorted by length within
    a chunk and batched by `max_tokens` padded positions; results are written in input order.
    The file is written beside `output_path` and renamed into place when complete; an existing
    output is refused unless `overwrite`, the input always. Logs sentences/s and tokens/s;
    returns the number of lines."""
    if layers not in LAYER_MODES:
        raise UserError(f"unknown --layers {layers!r}; expected one of {LAYER_MODES}")
    limits = {"batch_size": batch_size, "max_tokens": max_tokens, "max_sentence_tokens": max_sentence_tokens}
    for name, value in limits.items():
        if value < 1:
            raise UserError(f"--{name}={value}: must be a positive integer")
    input_path = Path(input_path)
    if not input_path.is_file():
        raise MissingFile(f"input file not found: {input_path}")
    with replacing(output_path, overwrite, (input_path,), "--output") as tmp:
        return _embed_lines(
            model, input_path, tmp, layers, batch_size, stateful, chunk_sentences, max_tokens, max_sentence_tokens
        )


def _embed_lines(
    model: Model, input_path: Path, output_path: Path, layers: str, batch_size: int, stateful: bool,
    chunk_sentences: int, max_tokens: int, max_sentence_tokens: int,
) -> int:
    with open(input_path, "rb") as f:
        total = sum(1 for _ in f)
    embedder = Embedder(model, batch_size, stateful, max_tokens)
    L1, width = model.config.lstm.n_layers + 1, 2 * model.config.lstm.projection_dim
    empty_shape = (L1, 0, width) if layers == "all" else (0, width)
    sentence_to_index: dict[str, str] = {}
    bar = ProgressBar(total, unit="lines")
    done = n_tokens = 0
    with h5py.File(output_path, "w") as out:
        lines = read_lines(input_path)
        while True:
            chunk = [(n - 1, text.split(), text) for n, text in itertools.islice(lines, chunk_sentences)]
            if not chunk:
                break
            for index, tokens, text in chunk:
                if len(tokens) > max_sentence_tokens:
                    raise UserError(
                        f"{input_path}: line {index + 1} has {len(tokens):,} tokens, more than --max_sentence_tokens="
                        f"{max_sentence_tokens:,} (is it one sentence?); split it or raise the limit"
                    )
                sentence_to_index[text] = str(index)
                if not tokens:
                    out.create_dataset(str(index), shape=empty_shape, dtype=np.float32)
            work = [c for c in chunk if c[1]]
            for (index, _, _), vectors in zip(work, embedder([c[1] for c in work])):
                out.create_dataset(str(index), data=_select(vectors, layers))
            done += len(chunk)
            n_tokens += sum(len(c[1]) for c in chunk)
            bar.update(done, suffix=f"{n_tokens / bar.elapsed():,.0f} tokens/s")
        bar.clear()
        out.create_dataset("sentence_to_index", data=[json.dumps(sentence_to_index)], dtype=h5py.string_dtype())
    seconds = bar.elapsed()
    log.info("%d sentences, %d tokens in %.1f s: %.1f sentences/s, %.0f tokens/s", done, n_tokens, seconds, done / seconds, n_tokens / seconds)
    return done
