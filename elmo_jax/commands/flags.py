"""Every command-line flag of `elmo-jax` (absl's, global): declared once here, each command
reads those its COMMAND lists."""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from elmo_jax.plan.targets import TARGETS

FLAGS = flags.FLAGS
# Flags of every command: the process's set-up (elmo_jax/commands/process.py).
COMMON_FLAGS = ("compile_cache", "verbose", "coordinator", "num_processes", "process_id", "coordinator_timeout")

config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment: a packaged one by name (listed below) or a config file's path; override any field with "
    "--config.a.b=value.",
    lock_config=True,
)
flags.DEFINE_string(
    "workdir",
    None,
    "Run folder: config.json, vocab.txt, checkpoints/, metrics.jsonl, tensorboard/ (embed, export: also a model "
    "folder: imported, exported, bilm-tf's files, or ELMoForManyLangs').",
)
flags.DEFINE_string(
    "data", None, "A source: demo, text:GLOB, lm1b:PATH or tfds:NAME (eval: default the run's config.data.heldout)."
)
flags.DEFINE_integer(
    "min_count", 1, "Keep words seen at least this many times (3 gives LM1B's 793,471 lines).", lower_bound=1
)
flags.DEFINE_integer(
    "max_sentences", 0, "Evaluate only the first N sentences, for a quick estimate (0 = all).", lower_bound=0
)
flags.DEFINE_integer(
    "batch_size", None, "eval: rows per batch (default: the run's config.train.eval_batch_size); embed, plan "
    "--mode=embed: sentences per batch (default 64).", lower_bound=1
)  # fmt: skip
flags.DEFINE_string(
    "model", None, "A published model by name (small, medium, original, original_5.5b) or the URL of its "
    "..._options.json: downloaded once into $ELMO_JAX_MODEL_CACHE (default $XDG_CACHE_HOME/elmo_jax/models); or "
    "a Hugging Face hub repo holding bilm-tf's two files, hf://OWNER/REPO[@REVISION] (needs elmo_jax[hub]); or a "
    "model folder (bilm-tf's files, an import or export, ELMoForManyLangs' unzipped)."
)  # fmt: skip
flags.DEFINE_string("options", None, "bilm-tf options.json.")
flags.DEFINE_string("weights", None, "bilm-tf weights.hdf5.")
flags.DEFINE_string(
    "output", None, "vocab: the vocabulary file; import, export: the model folder; embed: the HDF5 file; plot: the "
    "PNG (default WORKDIR/training_curves.png)."
)  # fmt: skip
flags.DEFINE_string("input", None, "Text file, one whitespace-tokenized sentence a line.")
flags.DEFINE_enum("layers", "all", ["all", "top", "average"], "Which layers to write.")
flags.DEFINE_bool("stateful", False, "Carry the LSTM state from batch to batch (bilm-tf, AllenNLP).")
flags.DEFINE_integer(
    "max_tokens", 8192, "Positions (rows x length) per round of rows; a longer line runs alone.", lower_bound=1
)
flags.DEFINE_integer(
    "max_sentence_tokens", 100_000, "A line with more tokens is refused (not one sentence).", lower_bound=1
)
flags.DEFINE_integer(
    "devices", None, "embed: split each batch's rows over the first N local devices (default: all of them); plan: "
    "the number of devices of the target (default 1).", lower_bound=1
)  # fmt: skip
flags.DEFINE_enum("target", "h200", list(TARGETS), "The accelerator to compile for (without having one).")
flags.DEFINE_enum("mode", "train", ["train", "embed"], "plan: the train step, or the programs that embed text.")
flags.DEFINE_integer(
    "vocab_size", 793_471, "Words in the softmax table (default: LM1B's, bilm-tf's vocabulary).", lower_bound=1
)
flags.DEFINE_bool(
    "fit",
    True,
    "plan: also find the largest per-device batch that fits the target's memory (compiles more; train mode).",
)
flags.DEFINE_string("hlo", None, "plan: also write the compiled program's text to this file.")
flags.DEFINE_string(
    "json", None, "plan: write every figure as JSON to this file (piped, plan prints it as its last line)."
)
flags.DEFINE_integer(
    "num_shards", 1, "Embed only every line i with i % num_shards == shard_index (one process per host).", lower_bound=1
)
flags.DEFINE_integer(
    "shard_index", 0, "Which share of the lines this process embeds: 0 .. num_shards - 1.", lower_bound=0
)
flags.DEFINE_bool("overwrite", False, "Replace an existing output (whole, atomically).")
flags.DEFINE_bool(
    "compile_cache",
    True,
    "Keep compiled programs in $XDG_CACHE_HOME/elmo_jax/jax (default ~/.cache/...), so a second run of the same "
    "model compiles nothing.",
)
flags.DEFINE_bool("verbose", False, "Show the traceback of an error (also: ELMO_JAX_TRACEBACK=1).")
flags.DEFINE_string("coordinator", None, "Multi-process runs: HOST:PORT of process 0, or auto (JAX's detection).")
flags.DEFINE_integer("num_processes", None, "Multi-process runs: the number of processes.", lower_bound=1)
flags.DEFINE_integer(
    "process_id", None, "Multi-process runs: this process's index, 0 .. num_processes - 1.", lower_bound=0
)
flags.DEFINE_integer(
    "coordinator_timeout",
    300,
    "Multi-process runs: seconds to wait for the coordinator and the other processes.",
    lower_bound=1,
)
