"""Weight files of the original code: bilm-tf / AllenNLP HDF5 <-> the params pytree."""
