"""Sentences -> ELMo layers, for JAX pipelines (`Embedder`) and files (`embed_file`).

Each sentence gets `<S>` and `</S>`, runs through the biLM and comes back without its
boundaries: (L + 1, n, 2P). Stateless by default: every sentence starts from a zero state, so
its vectors do not depend on its batch. With `stateful=True`, row i of each batch continues from
the state row i of the previous batch left (as bilm-tf and AllenNLP do).

The token layer is context-free, so each call encodes every distinct word of its sentences once
(`encode_words`: the char CNN, highway layers and projection, over words sorted by length in
pieces of ENCODER_CHUNK, each piece's character columns cut to its longest word plus the widest
filter), and the rows gather those vectors for the LSTMs (`lstm_layers_of_streams`), which
run WINDOW steps per call, carrying their state: one compiled program per row count, whatever
the sentence lengths. Where layer 0 runs in a loop of its own (the layers schedule, on CPU), its
input half of the gates is context-free too: computed once per distinct word
(`token_input_gates`, at most MAX_GATE_TABLE_BYTES) and gathered, not computed at every
position (a fifth of the LSTMs' matmul work at the published sizes); there the windows read
W_0's input and recurrent halves, split once (`split_input_weights`). Stateless, the sentences
are packed back to back into the rows of each round (`pack_rounds`), the state restarting at
each one, so that almost no position is padding, and each stream leaves out the boundary whose
output nothing reads (forward `</S>`, backward `<S>`; stateful, the state after it carries on,
so it stays). Exact: the same layers as `bilm_layers` on the full char ids.

Rows are split over this process's devices (`devices`: all by default), params replicated;
each device runs its own rows, so the vectors are those of one device.

Memory is bounded by tokens, not rows: a round holds at most `max_tokens` positions, so a very
long line runs alone; the table of gates holds at most MAX_GATE_TABLE_BYTES.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import h5py
import jax
import numpy as np

from elmo_jax import stop_signals
from elmo_jax.compile_time import CompileClock
from elmo_jax.config import ModelConfig
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.local_devices import LocalDevices
from elmo_jax.model.bilm import lstm_layers_of_streams, token_input_gates
from elmo_jax.model.lstm import LSTMState, schedule, split_input_weights
from elmo_jax.model.token_encoder import encode_tokens as encode_token_vectors
from elmo_jax.model_io import Model
from elmo_jax.outputs import replacing
from elmo_jax.progress import ProgressBar
from elmo_jax.text.batcher import bucket_size, char_columns
from elmo_jax.text.chars import CharTable, check_sentences
from elmo_jax.text.sources import read_lines

LAYER_MODES = ("all", "top", "average")
log = logging.getLogger(__name__)


ENCODER_CHUNK = 2048  # words the char CNN encodes at once (its activations dominate memory)
MAX_TOKENS = 8192  # positions (rows x length) per stateless round of rows
MAX_SENTENCE_TOKENS = 100_000  # a longer line is refused: most likely not one sentence
WINDOW = 8  # LSTM steps per call (lengths are padded to a multiple of it)
MAX_GATE_TABLE_BYTES = 1 << 30  # layer 0's input gates per distinct word (float32); above it, per position


def length_bucket(n: int) -> int:
    """Padded length for n positions: a multiple of WINDOW."""
    return max(WINDOW, -(-n // WINDOW) * WINDOW)


def rows_bucket(n: int, batch_size: int) -> int:
    """Padded rows for n sentences: the next power of two, at most batch_size."""
    return min(batch_size, 1 << max(n - 1, 0).bit_length())


@functools.cache
def _jitted_token_encoder(config: ModelConfig):
    return jax.jit(lambda params, chars: encode_token_vectors(params, chars, config))


@functools.cache
def _jitted_token_gates(config: ModelConfig):
    return jax.jit(lambda lstm_params, table_UP: token_input_gates(lstm_params, table_UP, config))


@functools.cache
def _jitted_lstm_window(config: ModelConfig):
    def window(lstm_params, table_UP, gates_2UG, ids_2BW, mask_BW, state, reset_BW):
        return lstm_layers_of_streams(
            lstm_params, table_UP, ids_2BW, mask_BW, state, config, reset_BT=reset_BW, gates_2UG=gates_2UG
        )

    return jax.jit(window)


def encode_words(
    model: Model,
    words_UC: np.ndarray,
    chunk: int = ENCODER_CHUNK,
    cut_columns: bool = True,
    devices: LocalDevices | None = None,
    params=None,
) -> np.ndarray:
    """Char ids of distinct words (U, C) -> their token vectors (U, P) float32. Sorted by length
    and encoded `chunk` at a time, each chunk's padding columns cut (`char_columns`: the longest
    word plus the widest filter; exact) unless `cut_columns` is False, and its rows padded to a
    power of two (and to a multiple of the devices, which split them): compiled once per (rows,
    columns) shape. `params`: the token encoder's, already on `devices` (default: copied there)."""
    config = model.config
    devices = devices or LocalDevices()
    params = params if params is not None else devices.replicate(model.params["token_encoder"])
    pad, lead = model.tokens.pad, model.tokens.lead
    char_window = config.char_cnn.widest_filter if cut_columns and pad is not None else None
    out = np.zeros((len(words_UC), config.lstm.projection_dim), np.float32)
    order = np.argsort((words_UC[:, lead:] != pad).sum(axis=1), kind="stable")
    encode = _jitted_token_encoder(config)
    for start in range(0, len(order), chunk):
        rows = order[start : start + chunk]
        words = words_UC[rows]
        columns = lead + char_columns(words[:, lead:], char_window, pad)
        padded = np.zeros((devices.round_up(rows_bucket(len(rows), chunk)), columns), np.int32)
        padded[: len(rows)] = words[:, : padded.shape[1]]
        out[rows] = np.asarray(encode(params, jax.device_put(padded, devices.sharded_on(0))))[: len(rows)]
    return out


class Embedder:
    """Tokenized sentences -> ELMo layers, one (L + 1, n, 2P) float32 numpy array each.

    Any number of sentences per call: stateless, they are packed back to back into rounds of up
    to `batch_size` rows and at most `max_tokens` positions (`pack_rounds`), each starting from
    a zero state; stateful, consecutive batches of `batch_size` rows, one sentence a row, row i
    continuing from the state row i left. Each call encodes its distinct words once. Results
    come back in input order; `batches` yields them round by round.

    The rows of each round are split over the first `devices` local devices (None: all), the
    params replicated on them; the vectors are the same as on one device.
    """

    def __init__(
        self,
        model: Model,
        batch_size: int = 64,
        stateful: bool = False,
        max_tokens: int = MAX_TOKENS,
        devices: int | None = None,
    ):
        self.model, self.config = model, model.config
        self.batch_size, self.stateful, self.max_tokens = batch_size, stateful, max_tokens
        self.devices = LocalDevices(devices)
        params = {k: model.params[k] for k in ("token_encoder", "lstm")}
        if schedule(self.config) == "layers":  # its windows read W_0's halves: split once (numpy: no compile)
            params["lstm"] = split_input_weights(jax.tree.map(np.asarray, params["lstm"]))
        self.params = self.devices.replicate(params)
        self.chars = CharTable(model.tokens)
        self.state = self._zero_state(self.devices.round_up(batch_size))
        self.table_rows = 0  # the word table's rows: only grows, so the LSTMs compile once per batch shape
        self.compiled: set[tuple[int, int]] = set()  # (rows, table rows) of the LSTM programs compiled

    def __call__(self, sentences: list[list[str]]) -> list[np.ndarray]:
        batches = self.batches(sentences)
        out: list[np.ndarray] = [None] * len(sentences)  # type: ignore[list-item]
        for indices, layers in batches:
            for i, vectors in zip(indices, layers):
                out[i] = vectors
        return out

    def batches(self, sentences: list[list[str]]) -> Iterator[tuple[list[int], list[np.ndarray]]]:
        """As `__call__`, batch by batch as they are computed: (the batch's sentence indices,
        their layers). The sentences are checked at once, before any batch is asked for."""
        check_sentences(sentences)
        return self._batches_of(sentences)

    def _batches_of(self, sentences: list[list[str]]) -> Iterator[tuple[list[int], list[np.ndarray]]]:
        n = len(sentences)
        if n == 0:
            return
        # Each position's row in the table of the call's distinct words.
        bos, eos = self.model.tokens.bos, self.model.tokens.eos
        cache_rows = [self.chars.ids([bos, *s, eos]) for s in sentences]
        distinct, inverse = np.unique(np.concatenate(cache_rows), return_inverse=True)
        self.table_rows = max(self.table_rows, self.devices.round_up(bucket_size(len(distinct))))
        table = np.zeros((self.table_rows, self.config.lstm.projection_dim), np.float32)
        ends = np.cumsum([len(r) for r in cache_rows])
        positions = np.split(inverse.astype(np.int32), ends[:-1])
        lengths = [stream_length(len(p), self.stateful) for p in positions]
        rounds = pack_rounds(lengths, self.batch_size, self.max_tokens, self.stateful)

        with concurrent.futures.ThreadPoolExecutor(1) as compiler:  # the LSTM programs, while the words are encoded
            done = {rows for rows, table_rows in self.compiled if table_rows == len(table)}
            if not done and uses_gates(self.config, len(table)):  # a new table size
                compiler.submit(self._compile_gates, len(table))
            for rows in {self._rows(len(lanes)) for lanes in rounds} - done:
                compiler.submit(self._compile_lstm, rows, table.shape)
            words = self.chars.lookup(distinct)
            table[: len(distinct)] = encode_words(
                self.model, words, devices=self.devices, params=self.params["token_encoder"]
            )
            on_device = jax.device_put(table, self.devices.replicated), self._gates(table)
        for lanes in rounds:
            yield [i for lane in lanes for i in lane], self._run(lanes, positions, table, on_device)

    def _gates(self, table: np.ndarray) -> jax.Array | None:
        """The words' `token_input_gates` (2, U, 4C), replicated (each device computes its share
        of the words'), or None where they are computed at each position."""
        if not uses_gates(self.config, len(table)):
            return None
        gates = _jitted_token_gates(self.config)(self.params["lstm"], jax.device_put(table, self.devices.sharded_on(0)))
        return jax.device_put(gates, self.devices.replicated)

    def _rows(self, lanes: int) -> int:
        """The rows of a round of this many lanes."""
        rows = self.batch_size if self.stateful else rows_bucket(lanes, self.batch_size)
        return self.devices.round_up(rows)

    def _compile_gates(self, table_rows: int) -> None:
        """Compiles `_gates`'s program for a table of `table_rows` (on the side, as `_compile_lstm`)."""
        lower_token_gates(self.config, self.devices, self.params["lstm"], table_rows).compile()

    def _compile_lstm(self, rows: int, table_shape: tuple[int, int]) -> None:
        """Compiles the LSTM window program for rounds of `rows` (run on the side: `_run`'s
        calls then find it compiled)."""
        lower_lstm_window(self.config, self.devices, self.params["lstm"], rows, table_shape[0]).compile()
        self.compiled.add((rows, table_shape[0]))

    def _zero_state(self, rows: int) -> LSTMState:
        """Zeros in numpy (jnp.zeros would be one more compiled program per shape), rows split
        over the devices."""
        shapes = jax.eval_shape(lambda: LSTMState.zeros(self.config, rows))
        return LSTMState(*(jax.device_put(np.zeros(x.shape, np.float32), self.devices.sharded_on(2)) for x in shapes))

    def _run(
        self,
        lanes: list[list[int]],
        positions: list[np.ndarray],
        table: np.ndarray,
        on_device: tuple[jax.Array, jax.Array | None],
    ) -> list[np.ndarray]:
        """One round: sentences packed into rows (`lanes`: the sentence indices of each row, back
        to back) -> one (L + 1, n, 2P) array per sentence, in the lanes' order. `on_device`: the
        table and its gates (`_gates`) on the devices. The LSTMs run WINDOW steps per call, the
        state carried from window to window and restarted at each sentence a row holds after its
        first."""
        ids_2BT, mask_BT, reset_BT, slots = padded_streams(
            [[positions[i] for i in lane] for lane in lanes], self._rows(len(lanes)), self.stateful
        )
        state = self.state if self.stateful else self._zero_state(mask_BT.shape[0])
        run, windows = _jitted_lstm_window(self.config), []
        on_rows = self.devices.sharded_on(0)
        for start in range(0, mask_BT.shape[1], WINDOW):
            window = slice(start, start + WINDOW)
            ids = jax.device_put(ids_2BT[:, :, window], self.devices.sharded_on(1))
            mask, reset = jax.device_put(mask_BT[:, window], on_rows), jax.device_put(reset_BT[:, window], on_rows)
            out, state = run(self.params["lstm"], *on_device, ids, mask, state, reset)
            windows.append(out)
        if self.stateful:
            self.state = state
        lstm_L2BTP = np.concatenate([np.asarray(w) for w in windows], axis=3)
        sentences = [positions[i] for lane in lanes for i in lane]
        return [_sentence_layers(table, lstm_L2BTP, row, start, p) for (row, start), p in zip(slots, sentences)]


def uses_gates(config: ModelConfig, table_rows: int) -> bool:
    """Whether the LSTMs gather layer 0's input gates from a table of the words' (see the
    module's docstring)."""
    table_bytes = 2 * table_rows * 4 * config.lstm.dim * 4
    return schedule(config) == "layers" and table_bytes <= MAX_GATE_TABLE_BYTES


def _shaped(tree, sharding):
    """Arrays (or shapes) -> ShapeDtypeStructs laid out by `sharding`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def lower_token_encoder(config: ModelConfig, devices: LocalDevices, encoder_params, rows: int, columns: int):
    """`encode_words`'s program for pieces of `rows` words of `columns` characters, lowered from
    shapes (`encoder_params`: the token encoder's or their shapes, replicated on `devices`)."""
    chars = jax.ShapeDtypeStruct((rows, columns), np.int32, sharding=devices.sharded_on(0))
    return _jitted_token_encoder(config).lower(_shaped(encoder_params, devices.replicated), chars)


def lower_token_gates(config: ModelConfig, devices: LocalDevices, lstm_params, table_rows: int):
    """`token_input_gates`'s program for a word table of `table_rows`, lowered from shapes."""
    table = jax.ShapeDtypeStruct((table_rows, config.lstm.projection_dim), np.float32, sharding=devices.sharded_on(0))
    return _jitted_token_gates(config).lower(_shaped(lstm_params, devices.replicated), table)


def lower_lstm_window(config: ModelConfig, devices: LocalDevices, lstm_params, rows: int, table_rows: int):
    """The LSTM window program (WINDOW steps of every layer, both directions) for rounds of
    `rows` split over `devices` and a word table of `table_rows`, lowered from shapes
    (`lstm_params`: or their shapes, replicated on `devices`, split as the Embedder splits
    them)."""
    state = jax.eval_shape(lambda: LSTMState.zeros(config, rows))
    gates = (2, table_rows, 4 * config.lstm.dim) if uses_gates(config, table_rows) else None
    by_row = devices.sharded_on(0)
    return _jitted_lstm_window(config).lower(
        _shaped(lstm_params, devices.replicated),
        jax.ShapeDtypeStruct((table_rows, config.lstm.projection_dim), np.float32, sharding=devices.replicated),
        gates and jax.ShapeDtypeStruct(gates, np.float32, sharding=devices.replicated),
        jax.ShapeDtypeStruct((2, rows, WINDOW), np.int32, sharding=devices.sharded_on(1)),
        jax.ShapeDtypeStruct((rows, WINDOW), np.bool_, sharding=by_row),
        _shaped(state, devices.sharded_on(2)),
        jax.ShapeDtypeStruct((rows, WINDOW), np.bool_, sharding=by_row),
    )


def pack_rounds(lengths: list[int], batch_size: int, max_tokens: int, stateful: bool) -> list[list[list[int]]]:
    """Sentences of these lengths (positions, with boundaries) -> rounds of rows ("lanes"), each
    row a list of sentence indices that run back to back. Stateful: consecutive sentences, one a
    row, batch_size rows a round. Stateless: the longest first, each into the first row with
    room, rows as long as the longest left or an even share of what is left, so that rows are
    nearly full; a round holds at most max_tokens padded positions (at most batch_size rows), a
    very long sentence alone."""
    if stateful:
        return [
            [[i] for i in range(start, min(start + batch_size, len(lengths)))]
            for start in range(0, len(lengths), batch_size)
        ]
    rounds, left = [], sorted(range(len(lengths)), key=lambda i: -lengths[i])
    while left:
        share = -(-sum(lengths[i] for i in left) // batch_size)
        room = length_bucket(max(lengths[left[0]], min(share, max_tokens // batch_size)))
        rows = min(batch_size, 1 << max(max_tokens // room, 1).bit_length() - 1)  # a power of two
        lanes: list[list[int]] = []
        fills: list[int] = []
        later = []
        for i in left:
            row = next((r for r, fill in enumerate(fills) if fill + lengths[i] <= room), None)
            if row is None and len(lanes) < rows:
                row = len(lanes)
                lanes.append([])
                fills.append(0)
            if row is None:
                later.append(i)
            else:
                lanes[row].append(i)
                fills[row] += lengths[i]
        rounds.append(lanes)
        left = later
    return rounds


def stream_length(positions: int, whole: bool) -> int:
    """A sentence's positions (with its boundaries) in each of its streams: all of them if
    `whole` (stateful: the state after the last carries on), else all but the boundary whose
    output nothing reads (forward `</S>`, backward `<S>`)."""
    return positions if whole else positions - 1


def padded_streams(
    lanes: list[list[np.ndarray]], rows: int, whole: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """The table rows of the sentences of each row (with their boundaries), back to back -> the
    forward stream and the backward one (each sentence reversed in place) (2, rows, T), the mask
    and where the state restarts (rows, T), T = length_bucket of the longest row, and each
    sentence's (row, first position), in the lanes' order. Unless `whole`, a sentence's forward
    stream stops before its `</S>` and its backward stream before its `<S>` (`stream_length`)."""
    T = length_bucket(max(sum(stream_length(len(p), whole) for p in lane) for lane in lanes))
    ids = np.zeros((2, rows, T), np.int32)
    mask, reset = np.zeros((rows, T), bool), np.zeros((rows, T), bool)
    slots = []
    for row, lane in enumerate(lanes):
        start = 0
        for p in lane:
            n = stream_length(len(p), whole)
            end = start + n
            ids[0, row, start:end], ids[1, row, start:end] = p[:n], p[::-1][:n]
            mask[row, start:end] = True
            reset[row, start] = start > 0
            slots.append((row, start))
            start = end
    return ids, mask, reset, slots


def _sentence_layers(table: np.ndarray, lstm_L2BTP: np.ndarray, row: int, start: int, p: np.ndarray) -> np.ndarray:
    """The layers of the sentence at `start` in `row`, without its boundaries (L + 1, n, 2P):
    [token | token], then [forward | backward] of each LSTM layer (the backward stream holds the
    sentence reversed in place)."""
    n = len(p)
    tokens = table[p[1 : n - 1]]
    forward = lstm_L2BTP[:, 0, row, start + 1 : start + n - 1]
    backward = lstm_L2BTP[:, 1, row, start + n - 2 : start : -1]
    return np.concatenate(
        [np.concatenate([tokens, tokens], axis=-1)[None], np.concatenate([forward, backward], axis=-1)]
    )


def token_embeddings(model: Model, words: list[str], batch_size: int = 4096) -> np.ndarray:
    """The context-independent token layer (n, P) of each word, like bilm-tf's
    dump_token_embeddings: a cache for vocabularies. Encoded `batch_size` words at a time,
    compiled once per model config and (rows, columns) shape."""
    return encode_words(model, CharTable(model.tokens).encode(words), batch_size)


class _Writer:
    """Writes (name, array) datasets into an open HDF5 file on a thread of its own, one batch
    behind the caller, so that writing overlaps the next batch's computation. An error in the
    writer is raised in the caller, at its next put or at the end."""

    def __init__(self, out: h5py.File):
        self.out, self.pool = out, concurrent.futures.ThreadPoolExecutor(1)
        self.pending: concurrent.futures.Future | None = None

    def put(self, datasets: list[tuple[str, np.ndarray]]) -> None:
        self._wait()
        self.pending = self.pool.submit(lambda: [self.out.create_dataset(name, data=data) for name, data in datasets])

    def _wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *error) -> None:
        try:
            if error[0] is None:
                self._wait()
        finally:
            self.pool.shutdown(wait=True)


def _select(layers: np.ndarray, mode: str) -> np.ndarray:
    if mode == "all":
        return layers
    if mode == "top":
        return layers[-1]
    return layers.mean(axis=0)


def check_shard(shard_index: int, num_shards: int) -> None:
    """A share of the lines (`embed_file`'s `shard`): 0 <= shard_index < num_shards."""
    if not 0 <= shard_index < num_shards:
        raise UserError(
            f"shard_index={shard_index} num_shards={num_shards}: need 0 <= shard_index < num_shards",
            ("shard_index", "num_shards"),
        )


def check_input(path: str | Path) -> Path:
    """The input text file, refused where it is a folder, missing or without a word (errors name
    `input`)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"input={path} is a folder: give a text file, one sentence a line", ("input",))
    if not path.is_file():
        raise MissingFile(f"input={path}: file not found", ("input",))
    with open(path, "rb") as f:
        if not any(line.strip() for line in f):  # stops at the first line with a word
            raise UserError(f"input={path} has no words (it is empty or blank): nothing to embed", ("input",))
    return path


def embed_file(
    model: Model,
    input_path: str | Path,
    output_path: str | Path,
    layers: str = "all",
    *,
    batch_size: int = 64,
    stateful: bool = False,
    chunk_sentences: int = 4096,
    max_tokens: int = MAX_TOKENS,
    max_sentence_tokens: int = MAX_SENTENCE_TOKENS,
    overwrite: bool = False,
    devices: int | None = None,
    shard: tuple[int, int] = (0, 1),
) -> int:
    """One whitespace-tokenized sentence a line -> HDF5 as `allennlp elmo` writes it: dataset
    "i" for line i, (L + 1, n, 2P) for `all` or (n, 2P) for `top` / `average`, plus
    `sentence_to_index`. Lines are read in chunks and, unless stateful, packed into rows of
    rounds of at most `max_tokens` positions; results are written in input order.
    The file is written beside `output_path` and renamed into place when complete; an existing
    output is refused unless `overwrite`, the input always. The batches' rows are split over the
    first `devices` local devices (None: all). `shard` = (index, count): only the lines i (from
    0) with i % count == index, one share per process of a multi-host job, each into its own
    file (the datasets keep their line numbers). Logs sentences/s and tokens/s; returns the
    number of lines embedded."""
    if layers not in LAYER_MODES:
        raise UserError(f"layers={layers!r}: expected one of {LAYER_MODES}", ("layers",))
    limits = {"batch_size": batch_size, "max_tokens": max_tokens, "max_sentence_tokens": max_sentence_tokens}
    for name, value in limits.items():
        if value < 1:
            raise UserError(f"{name}={value}: must be a positive integer", (name,))
    check_shard(*shard)
    input_path = check_input(input_path)
    with replacing(output_path, overwrite, (input_path,)) as tmp:
        embedder = Embedder(model, batch_size, stateful, max_tokens, devices)
        return _embed_lines(embedder, input_path, tmp, layers, chunk_sentences, max_sentence_tokens, shard)


def _embed_lines(
    embedder: Embedder,
    input_path: Path,
    output_path: Path,
    layers: str,
    chunk_sentences: int,
    max_sentence_tokens: int,
    shard: tuple[int, int],
) -> int:
    shard_index, shard_count = shard
    with open(input_path, "rb") as f:
        total = len(range(shard_index, sum(1 for _ in f), shard_count))
    bar, clock = ProgressBar(total, unit="lines"), CompileClock()  # compilation is timed apart
    L1, width = embedder.config.lstm.n_layers + 1, 2 * embedder.config.lstm.projection_dim
    empty_shape = (L1, 0, width) if layers == "all" else (0, width)
    sentence_to_index: dict[str, str] = {}
    done = n_tokens = 0
    with bar, h5py.File(output_path, "w") as out, _Writer(out) as writer:
        lines = (line for line in read_lines(input_path) if (line[0] - 1) % shard_count == shard_index)
        while True:
            stop_signals.check()
            chunk = [(n - 1, text.split(), text) for n, text in itertools.islice(lines, chunk_sentences)]
            if not chunk:
                break
            for index, tokens, text in chunk:
                if len(tokens) > max_sentence_tokens:
                    raise UserError(
                        f"{input_path}: line {index + 1} has {len(tokens):,} tokens, more than max_sentence_tokens="
                        f"{max_sentence_tokens:,} (is it one sentence?); split it or raise the limit",
                        ("max_sentence_tokens",),
                    )
                sentence_to_index[text] = str(index)
            writer.put([(str(i), np.zeros(empty_shape, np.float32)) for i, tokens, _ in chunk if not tokens])
            work = [c for c in chunk if c[1]]
            for batch, vectors in embedder.batches([c[1] for c in work]):
                writer.put([(str(work[k][0]), _select(v, layers)) for k, v in zip(batch, vectors)])
            done += len(chunk)
            n_tokens += sum(len(c[1]) for c in chunk)
            bar.update(done, f"{n_tokens / bar.elapsed():,.0f} tokens/s")
        writer.put([("sentence_to_index", np.array([json.dumps(sentence_to_index)], dtype=h5py.string_dtype()))])
    seconds = bar.elapsed()
    log.info(
        "%d sentences, %d tokens in %.1f s: %.1f sentences/s, %.0f tokens/s (%s, some alongside the work)",
        done,
        n_tokens,
        seconds,
        done / seconds,
        n_tokens / seconds,
        clock.since(),
    )
    return done
