"""Runs INSIDE the bilm-tf side environment (tests/reference/bilm_tf_env.py; run by bilm_tf.py),
never imported by the project: one inference model through bilm-tf's own code.

    python bilm_tf_inference.py JOB.json OUT.npz STATS.json

JOB names options_file, weight_file, vocab_file, sentences_file (3 lists of as many sentences) and
mixes ({name: {use_top_only, do_layer_norm, W, gamma}}). The batches (batch i = the i-th
sentence of each list, Batcher-encoded) go through ONE BidirectionalLanguageModel
(max_batch_size 4, stateful, as bilm-tf's tests/test_model.py runs it); each batch's run also
evaluates bilm.elmo.weight_layers for each mix (W and gamma assigned). Then
bilm.model.dump_token_embeddings on the vocabulary. OUT.npz gets:

    lm_embeddings/<k>/<i>                (2, n, P) [forward, backward] top layer of sentences[k][i], no <S>/</S>
    token_embeddings                     (len(vocab), P)
    layers/batch_<i>/char_ids            (3, T, 50) int32, the Batcher's
    layers/batch_<i>/token_layer         (3, T, P)
    layers/batch_<i>/lstm/<dir>/layer_<l>            (3, T, P), sentence order
    layers/batch_<i>/final_state/<dir>/layer_<l>/{c,h}   (3, C), (3, P): what batch i left in the
                                         graph's state variables, batch i + 1's initial state
    layers/weight_layers/<mix>/output/batch_<i>      (3, T - 2, 2P)

STATS.json: how often the clips fired (from a float64 numpy replay of the LSTMs on bilm-tf's
token vectors and states, which must also agree with bilm-tf's outputs) and that agreement.
"""

import os
import sys
import tempfile

import h5py
import numpy as np
from bilm import Batcher, BidirectionalLanguageModel, dump_token_embeddings, weight_layers
from bilm_tf_side import DIRECTIONS, hand_back, read_json, tf


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


class Replay:
    """float64 numpy LSTMs (TF LSTMCell with projection and clips) replaying bilm-tf's, counting
    the positions where the clips fire."""

    def __init__(self, weight_file, options):
        self.lstm = options["lstm"]
        with h5py.File(weight_file, "r") as f:
            self.weights = {
                (d, l): [
                    f[f"RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/{n}"][...].astype(np.float64)
                    for n in ("W_0", "B", "W_P_0")
                ]
                for d in range(2)
                for l in range(self.lstm["n_layers"])
            }
        self.counts = {"cell": 0, "cell_total": 0, "proj": 0, "proj_total": 0}
        self.max_diff = 0.0
        self.max_ratio = 0.0  # of |diff| to the tests' tolerance, 1e-5 + 1e-5 |bilm-tf's value|

    def compare(self, got, want):
        diff = np.abs(got - want)
        self.max_diff = max(self.max_diff, float(diff.max(initial=0.0)))
        self.max_ratio = max(self.max_ratio, float((diff / (1e-5 + 1e-5 * np.abs(want))).max(initial=0.0)))

    def run(self, tokens, lengths, init, outputs, final):
        """tokens (B, T, P); init/final {(d, l): (c, h)} rows (B, .); outputs {(d, l): (B, T, P)}."""
        cell_clip, proj_clip = self.lstm["cell_clip"], self.lstm["proj_clip"]
        C = self.lstm["dim"]
        for b, n in enumerate(lengths):
            for d in range(2):
                x = tokens[b, :n].astype(np.float64)
                x = x[::-1] if d else x
                for l in range(self.lstm["n_layers"]):
                    W, B, W_P = self.weights[(d, l)]
                    c, h = (init[(d, l)][0][b].astype(np.float64), init[(d, l)][1][b].astype(np.float64))
                    out = []
                    for t in range(n):
                        z = np.concatenate([x[t], h]) @ W + B
                        i, j, f, o = z[:C], z[C : 2 * C], z[2 * C : 3 * C], z[3 * C :]
                        c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j)
                        self.counts["cell"] += int(np.sum(np.abs(c) > cell_clip))
                        self.counts["cell_total"] += c.size
                        c = np.clip(c, -cell_clip, cell_clip)
                        h = (sigmoid(o) * np.tanh(c)) @ W_P
                        self.counts["proj"] += int(np.sum(np.abs(h) > proj_clip))
                        self.counts["proj_total"] += h.size
                        h = np.clip(h, -proj_clip, proj_clip)
                        out.append(h + x[t] if l > 0 and self.lstm["use_skip_connections"] else h)
                    x = np.array(out)
                    self.compare(x[::-1] if d else x, outputs[(d, l)][b, :n])
                    for got, recorded in zip((c, h), final[(d, l)]):
                        self.compare(got, recorded[b])

    def stats(self):
        return {
            "cell_clip_fired_fraction": round(self.counts["cell"] / self.counts["cell_total"], 4),
            "proj_clip_fired_fraction": round(self.counts["proj"] / self.counts["proj_total"], 4),
            "numpy_float64_replay_max_abs_diff": float(f"{self.max_diff:.3g}"),
            "numpy_float64_replay_max_diff_over_tolerance": round(self.max_ratio, 3),
        }


def main(job_file, out_file, stats_file):
    job = read_json(job_file)
    options = read_json(job["options_file"])
    sentences = read_json(job["sentences_file"])
    max_chars = options["char_cnn"]["max_characters_per_token"]
    P = options["lstm"]["projection_dim"]
    L = options["lstm"]["n_layers"]
    out = {}
    replay = Replay(job["weight_file"], options)

    with tf.Graph().as_default():
        batcher = Batcher(job["vocab_file"], max_chars)
        ids = tf.placeholder("int32", shape=(None, None, max_chars))
        model = BidirectionalLanguageModel(job["options_file"], job["weight_file"], max_batch_size=4)
        ops = model(ids)
        graph = model._graphs[ids]
        mixes = {
            name: weight_layers(
                name, ops, l2_coef=0.0, use_top_only=mix["use_top_only"], do_layer_norm=mix["do_layer_norm"]
            )["weighted_op"]
            for name, mix in job["mixes"].items()
        }
        state_variables = {
            (d, l): graph.lstm_init_states[direction][l] for d, direction in enumerate(DIRECTIONS) for l in range(L)
        }
        with tf.Session(config=tf.ConfigProto(device_count={"GPU": 0})) as sess:
            sess.run(tf.global_variables_initializer())
            variables = {v.name: v for v in tf.global_variables()}
            for name, mix in job["mixes"].items():
                if not mix["use_top_only"]:
                    variables[f"{name}_ELMo_W:0"].load(np.asarray(mix["W"], np.float32), sess)
                variables[f"{name}_ELMo_gamma:0"].load(np.asarray([mix["gamma"]], np.float32), sess)
            fetches = {
                "lm_embeddings": ops["lm_embeddings"],
                "token_layer": graph.embedding,
                "lstm": graph.lstm_outputs,
                "final": graph.lstm_final_states,
                "mixes": mixes,
            }
            for i in range(len(sentences[0])):
                batch = [sentences[k][i].split() for k in range(3)]
                char_ids = batcher.batch_sentences(batch)
                lengths = [len(s) + 2 for s in batch]
                init = {key: [value[:3] for value in sess.run(v)] for key, v in state_variables.items()}
                got = sess.run(fetches, feed_dict={ids: char_ids})
                after = {key: [value[:3] for value in sess.run(v)] for key, v in state_variables.items()}
                prefix = f"layers/batch_{i}"
                out[f"{prefix}/char_ids"] = char_ids.astype(np.int32)
                out[f"{prefix}/token_layer"] = got["token_layer"]
                outputs, final = {}, {}
                for d, direction in enumerate(DIRECTIONS):
                    for l in range(L):
                        outputs[(d, l)] = got["lstm"][direction][l]
                        out[f"{prefix}/lstm/{direction}/layer_{l}"] = outputs[(d, l)]
                        c, h = got["final"][direction][l]
                        final[(d, l)] = (c, h)
                        # the graph's state variables now hold exactly what the LSTMs left
                        assert np.array_equal(after[(d, l)][0], c) and np.array_equal(after[(d, l)][1], h)
                        # the state each batch starts from is the one the batch before left (zeros first)
                        previous = out.get(f"layers/batch_{i - 1}/final_state/{direction}/layer_{l}/c")
                        assert np.array_equal(init[(d, l)][0], np.zeros_like(c) if previous is None else previous)
                        out[f"{prefix}/final_state/{direction}/layer_{l}/c"] = c
                        out[f"{prefix}/final_state/{direction}/layer_{l}/h"] = h
                for name in mixes:
                    out[f"layers/weight_layers/{name}/output/batch_{i}"] = got["mixes"][name]
                for k in range(3):
                    top = got["lm_embeddings"][k, -1, : lengths[k] - 2]
                    out[f"lm_embeddings/{k}/{i}"] = np.stack([top[:, :P], top[:, P:]])
                replay.run(got["token_layer"], lengths, init, outputs, final)

    with tempfile.TemporaryDirectory() as tmp, tf.Graph().as_default():
        path = os.path.join(tmp, "embeddings.hdf5")
        dump_token_embeddings(job["vocab_file"], job["options_file"], job["weight_file"], path)
        with h5py.File(path, "r") as f:
            out["token_embeddings"] = f["embedding"][...]

    stats = replay.stats()
    assert stats["numpy_float64_replay_max_diff_over_tolerance"] < 1, stats
    hand_back(out, out_file, stats, stats_file)


if __name__ == "__main__":
    main(*sys.argv[1:])
