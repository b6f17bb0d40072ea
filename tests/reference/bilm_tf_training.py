"""Runs INSIDE the bilm-tf side environment (tests/reference/bilm_tf_env.py; run by bilm_tf.py),
never imported by the project: four steps of bilm-tf's own bilm.training.train(), recorded by
observers that leave its computation alone.

    python bilm_tf_training.py JOB.json OUT.npz OUT.json

JOB names options (n_train_tokens = 4 batches' worth, so train() stops by itself after 4),
train_file, vocab_file and save_dir (train()'s checkpoint and log folder). train() builds its
graph and runs its loop itself, on BidirectionalLMDataset(train_file, vocab, test=False,
shuffle_on_load=False), graph seed 0. The observers:

- LanguageModel._build_loss is wrapped to note its input (the top LSTM outputs) and the model;
- clip_by_global_norm_summary (which clip_grads calls) is wrapped to note the gradients it
  receives and the global norm TensorFlow computes from them;
- AdagradOptimizer.apply_gradients is wrapped to note the train op it returns;
- the dataset's iter_batches is wrapped to copy each batch it yields;
- Session.run is wrapped: on train()'s own training-step call (train op first) it reads every
  global variable before step 1, adds the noted tensors to the same run's fetches (handing
  train() exactly its own fetches' results), and reads every global variable after the step;
- tf.ConfigProto gets one thread per pool (bilm-tf's sessions too; bilm_tf_side.py):
  deterministic on CPU.

OUT.npz holds fixture.hdf5's datasets under their names (tests/fixtures/bilm_tf_training/
README.md); OUT.json the variable lists, each dataset's attributes and a summary per step.
"""

import os
import random
import sys
import tempfile

import numpy as np
from bilm import training
from bilm.data import BidirectionalLMDataset
from bilm_tf_side import DIRECTIONS, hand_back, read_json, tf


def variable_path(name):
    """A TF variable name -> its dataset name: no ':0'; an Adagrad slot '<var>/Adagrad' goes to
    'adagrad_accumulator/<var>' (HDF5 cannot hold a dataset and a group of the same name)."""
    name = name[: -len(":0")] if name.endswith(":0") else name
    return f"adagrad_accumulator/{name[: -len('/Adagrad')]}" if name.endswith("/Adagrad") else name


def main(job_file, out_file, meta_file):
    job = read_json(job_file)
    options = job["options"]
    B, T, P = options["batch_size"], options["unroll_steps"], options["lstm"]["projection_dim"]
    n_layers = options["lstm"]["n_layers"]
    noted = {}
    batches = []
    out = {}
    attrs = {}
    summary = []

    original_build_loss = training.LanguageModel._build_loss

    def build_loss(self, lstm_outputs):
        noted["model"], noted["lstm_outputs"] = self, list(lstm_outputs)
        return original_build_loss(self, lstm_outputs)

    original_clip = training.clip_by_global_norm_summary

    def clip_summary(t_list, clip_norm, norm_name, variables):
        clipped, norm, ops = original_clip(t_list, clip_norm, norm_name, variables)
        noted["grads"], noted["norm"] = list(zip(t_list, variables)), norm
        return clipped, norm, ops

    original_apply = tf.train.AdagradOptimizer.apply_gradients

    def apply_gradients(self, *args, **kwargs):
        noted["train_op"] = original_apply(self, *args, **kwargs)
        return noted["train_op"]

    def read_variables(session, run, prefix):
        variables = tf.global_variables()
        for variable, value in zip(variables, run(session, variables)):
            name = f"{prefix}/{variable_path(variable.name)}"
            out[name], attrs[name] = np.asarray(value), {"tf_name": variable.name}

    original_run = tf.Session.run

    def run(self, fetches, feed_dict=None, **kwargs):
        if "train_op" not in noted or not (isinstance(fetches, list) and fetches and fetches[0] is noted["train_op"]):
            return original_run(self, fetches, feed_dict, **kwargs)
        k = len(batches)
        if k == 1:
            read_variables(self, original_run, "initial")
        model = noted["model"]
        extra = {
            "lstm_outputs": noted["lstm_outputs"],
            "losses": [model.total_loss, *model.individual_losses],
            "grads": [tf.convert_to_tensor(g) for g, _ in noted["grads"]],
            "norm": noted["norm"],
        }
        ret = original_run(self, [*fetches, extra], feed_dict, **kwargs)
        ret, got = ret[:-1], ret[-1]
        step = f"step_{k}"
        for key, value in batches[-1].items():
            out[f"{step}/batch/{key}"] = value.astype(np.int32)
        finals = ret[3:]
        for d, direction in enumerate(DIRECTIONS):
            init = feed_dict[model.init_lstm_state[d]]
            for l in range(n_layers):
                for which, state in (("init_state", init[l]), ("final_state", finals[d][l])):
                    out[f"{step}/{which}/{direction}/layer_{l}/c"] = np.asarray(state[0], np.float32)
                    out[f"{step}/{which}/{direction}/layer_{l}/h"] = np.asarray(state[1], np.float32)
            out[f"{step}/lstm_outputs/{direction}"] = got["lstm_outputs"][d].reshape(B, T, P)
        for name, value in zip(("loss", "loss_forward", "loss_backward"), got["losses"]):
            out[f"{step}/{name}"] = np.float32(value)
        out[f"{step}/train_perplexity"] = np.float32(ret[2])
        for (_, variable), value in zip(noted["grads"], got["grads"]):
            name = f"{step}/grads/{variable_path(variable.name)}"
            out[name], attrs[name] = value, {"tf_name": variable.name}
        out[f"{step}/grad_norm"] = np.float32(got["norm"])
        out[f"{step}/clip_fired"] = np.bool_(got["norm"] > options["all_clip_norm_val"])
        read_variables(self, original_run, f"{step}/after")
        summary.append(
            {
                "step": k,
                **{name: round(float(out[f"{step}/{name}"]), 6) for name in ("loss", "loss_forward", "loss_backward")},
                "grad_norm": round(float(got["norm"]), 6),
                "clip_fired": bool(out[f"{step}/clip_fired"]),
            }
        )
        return ret

    vocab = training.load_vocab(job["vocab_file"], options["char_cnn"]["max_characters_per_token"])
    data = BidirectionalLMDataset(job["train_file"], vocab, test=False, shuffle_on_load=False)
    original_iter = data.iter_batches

    def iter_batches(batch_size, num_steps):
        for X in original_iter(batch_size, num_steps):
            batches.append({key: np.array(value) for key, value in X.items()})
            yield X

    data.iter_batches = iter_batches
    training.LanguageModel._build_loss = build_loss
    training.clip_by_global_norm_summary = clip_summary
    tf.train.AdagradOptimizer.apply_gradients = apply_gradients
    tf.Session.run = run

    random.seed(0)
    tf.reset_default_graph()
    tf.set_random_seed(0)
    os.makedirs(job["save_dir"], exist_ok=True)
    with tempfile.TemporaryDirectory() as log_dir:
        training.train(options, data, 1, job["save_dir"], log_dir)
        meta = {
            "trainable_variables": [variable_path(v.name) for v in tf.trainable_variables()],
            "gradient_variables": [variable_path(v.name) for _, v in noted["grads"]],
            "attrs": attrs,
            "summary": summary,
        }
    assert len(summary) == 4, f"train() ran {len(summary)} steps, not 4"
    hand_back(out, out_file, meta, meta_file)


if __name__ == "__main__":
    main(*sys.argv[1:])
