"""`elmo-jax plan`: the train step compiled for an accelerator this machine does not have
(targets.py), its kernels' costs read from the compiled program (kernels.py), its memory and
the largest batch that fits (program.py), and what it all means in time (report.py)."""
