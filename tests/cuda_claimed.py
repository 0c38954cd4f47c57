"""A pytest plugin (``-p tests.cuda_claimed``) under which torch claims a CUDA device on a
machine without one: for the checks ``--reference-device cuda`` makes before anything runs."""
import torch

torch.cuda.is_available = lambda: True
