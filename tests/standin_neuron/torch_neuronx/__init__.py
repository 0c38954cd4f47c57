"""A stand-in for the Neuron SDK's ``torch_neuronx``, used ONLY by the suite's tests.

It is never installed: tests put ``tests/standin_neuron`` on ``sys.path`` (and so on the
``PYTHONPATH`` of the children they start). It imitates what the ``neuron`` backend of the
suite relies on, over the CPU:

- importing it registers a ``torch.compile`` backend named ``neuron`` (AOTAutograd, then
  eager kernels: a real compile pipeline, but a CPU one);
- ``__version__`` and the ``torch-neuronx`` / ``neuronx-cc`` distribution records beside this
  package (``*.dist-info``) give versions to capture; ``bin/dpkg-query`` answers for the
  runtime package;
- every compile appends one JSON line to ``$STANDIN_NEURON_RECORD`` (when set) with the Neuron
  environment variables it saw, and writes an artefact into ``$TORCH_NEURONX_DEBUG_DIR`` and
  ``$NEURON_COMPILE_CACHE_URL`` (when set), so tests see where compiles went;
- ``STANDIN_NEURON_FAIL_COMPILE=1`` makes every compile fail, as a neuronx-cc error would. Like
  SDKs before 2.33, the stand-in then falls back to eager execution (a warning, and a correct
  output) unless ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1``: that is the trap the suite's
  guard must close.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.registry import lookup_backend

__version__ = "2.13.0+standin"
STANDIN = True

RECORD_ENV = "STANDIN_NEURON_RECORD"
FAIL_ENV = "STANDIN_NEURON_FAIL_COMPILE"
FALLBACK_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"
WATCHED_ENV = ("NEURON_RT_VISIBLE_CORES", FALLBACK_ENV, "TORCH_NEURONX_DEBUG_DIR",
               "NEURON_COMPILE_CACHE_URL")


class NeuronCompileError(RuntimeError):
    """What the stand-in raises for a failed compile (fallback disabled)."""


@register_backend(name="neuron")
def neuron_compiler(gm: torch.fx.GraphModule, example_inputs):
    failing = os.environ.get(FAIL_ENV) == "1"
    fallback_disabled = os.environ.get(FALLBACK_ENV) == "1"
    artefacts = _write_artefacts(gm)
    _record(failing=failing, fallback_disabled=fallback_disabled, artefacts=artefacts,
            pid=os.getpid(), env={name: os.environ.get(name) for name in WATCHED_ENV})
    if failing:
        error = NeuronCompileError("neuronx-cc (stand-in) failed to compile the graph: "
                                   "injected failure")
        if fallback_disabled:
            raise error
        warnings.warn(f"{error}; falling back to eager execution")
        return gm.forward  # the graph runs eagerly, as if nothing had failed
    return lookup_backend("aot_eager")(gm, example_inputs)


def _write_artefacts(gm: torch.fx.GraphModule) -> list[str]:
    code = gm.code
    key = hashlib.sha256(code.encode()).hexdigest()[:16]
    written = []
    for env, name in (("TORCH_NEURONX_DEBUG_DIR", f"graph-{key}.py"),
                      ("NEURON_COMPILE_CACHE_URL", f"MODULE_{key}.neff")):
        directory = os.environ.get(env)
        if directory:
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, name)
            with open(path, "w") as f:
                f.write(code)
            written.append(path)
    return written


def _record(**entry) -> None:
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
