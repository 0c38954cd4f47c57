"""The Neuron stand-ins for tests: ``torch_neuronx`` (see its docstring), PyPI's placeholder
package, stand-in host tools (``bin/``) and test backends.

The test backends are the real ``conformance.backends.neuron.Neuron`` with one thing changed,
the torch device the tensors go to (no Python package can create tensors on a ``neuron``
device): ``NeuronOnCpu`` runs the whole Neuron path (device check, environment, core pinning,
caches, artefacts, fallback guard, ``torch.compile(backend="neuron")`` of the stand-in) on CPU
tensors; ``NeuronOnRejectedDevice`` puts them on ``meta``, a device type upstream flex_attention
rejects before any kernel runs, as it rejects ``neuron``.
"""
from __future__ import annotations

from pathlib import Path

from conformance.backends.neuron import Neuron

#: Put this on sys.path (tests: monkeypatch.syspath_prepend) to import the stand-in.
STANDIN_DIR = Path(__file__).resolve().parent
#: Put this first on PATH for the stand-in dpkg-query, neuronx-cc and neuron-ls.
STANDIN_BIN = STANDIN_DIR / "bin"
#: Put this on sys.path instead to install PyPI's placeholder torch-neuronx 1.0.
PLACEHOLDER_DIR = STANDIN_DIR.parent / "standin_neuron_placeholder"


class NeuronOnCpu(Neuron):
    name = "neuron-standin-cpu"
    device_type = "cpu"


class NeuronOnRejectedDevice(Neuron):
    name = "neuron-standin-meta"
    device_type = "meta"
