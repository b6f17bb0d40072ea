"""Runs INSIDE the bilm-tf side environment, never imported by the project: what the two
in-environment scripts (bilm_tf_inference.py, bilm_tf_training.py) share, imported by them from
this folder (their sys.path[0]). Importing it sets TensorFlow up for them: compat.v1 as `tf`,
logging at ERROR (not bilm-tf's deprecation notices), and tf.ConfigProto with one thread per
pool for every session, bilm-tf's own included (with SideEnv.run's settings and oneDNN off:
deterministic on CPU)."""

import json

import numpy as np
import tensorflow.compat.v1 as tf

DIRECTIONS = ("forward", "backward")

tf.logging.set_verbosity(tf.logging.ERROR)
_ConfigProto = tf.ConfigProto


def single_threaded(**kwargs):
    """tf.ConfigProto with one thread per pool."""
    return _ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1, **kwargs)


tf.ConfigProto = single_threaded


def read_json(path):
    with open(path) as f:
        return json.load(f)


def hand_back(arrays, npz_file, value, json_file):
    """What a script hands back to the project: `arrays` as .npz, `value` as JSON."""
    np.savez(npz_file, **arrays)
    with open(json_file, "w") as f:
        json.dump(value, f)
