"""Which release a run measured: the facts of results.json's ``environment`` that two
measurements must share to be measurements of the same software.

One owner for both users: ``flexconf merge`` refuses shards of different releases, and
``flexconf gate --confirm`` refuses to measure a release again under a python that has
another (it would judge the wrong software, and could dismiss a real slowdown as noise).
"""
from __future__ import annotations

from typing import Any

from records.text import one_line

#: How ``python -m conformance.release_probe BACKEND`` starts its one line of JSON (the release
#: keys that python would record), read by ``flexconf gate --confirm`` (reports/confirm_plan.py)
PROBE_MARKER = "FLEXCONF-RELEASE "

#: What makes a release: the torch version and, where the backend records them,
#: its compiler stack (CUDA, ROCm, Triton, the Neuron SDK's packages and the compiler settings
#: it reads from the environment) and a plugin's own code (a digest of its package,
#: conformance/backends/base.py ``backend_code``: a plugin is software of its own, whatever
#: torch it runs on).
RELEASE_KEYS = ("torch", "cuda", "hip", "triton", "torch_neuronx", "neuronx_cc",
                "neuron_runtime", "NEURON_CC_FLAGS", "NEURON_COMPILER_OPT_LEVEL",
                "NEURON_LOGICAL_NC_CONFIG", "backend_code")


def release_of(environment: dict[str, Any]) -> dict[str, Any]:
    """The release keys ``environment`` records (absent ones left out)."""
    return {key: environment[key] for key in RELEASE_KEYS if key in environment}


def release_text(environment: dict[str, Any]) -> str:
    """The release ``environment`` records, for people: ``torch 2.14.1+cu130, triton 3.4.0``
    (a plugin's code by the start of its digest); "" when it records none."""
    parts = []
    for key, value in release_of(environment).items():
        if value in (None, ""):
            continue
        text = one_line(str(value))
        parts.append(f"plugin code {text[:12]}" if key == "backend_code" else f"{key} {text}")
    return ", ".join(parts)


def release_difference(recorded: dict[str, Any], found: dict[str, Any]) -> str | None:
    """How the release in ``found`` differs from the one ``recorded``: ``torch '2.13.0+cpu'
    where the run recorded '2.14.1+cu130'``; None when every recorded key agrees. A key the
    run did not record (an older results file, a plugin whose code could not be read) is not
    compared: what was not recorded cannot be checked."""
    for key in RELEASE_KEYS:
        if recorded.get(key) is not None and found.get(key) != recorded[key]:
            return (f"{key} {one_line(repr(found.get(key)))} where the run recorded "
                    f"{one_line(repr(recorded[key]))}")
    return None
