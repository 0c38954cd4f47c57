"""`flexconf backends`: every backend the suite knows, whether it can run here, and why not.

Lists the built-ins, every installed plugin (entry point group
``flexattention_conformance.backends``) and the example plugin of this repository when it is
not installed, then what ``--backend auto`` would pick.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

#: Plugins this repository ships as examples: name -> how to install (listed until installed).
EXAMPLE_PLUGINS = {
    "example-eager": "not installed; pip install ./examples/flexconf-example-backend "
                     "(from a checkout of this suite)",
}


@dataclass(frozen=True)
class BackendStatus:
    name: str
    available: bool
    origin: str  # built-in, plugin <distribution> <version>, or example
    detail: str  # the description when available, else the reason


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    statuses = backend_statuses()
    auto = next((s.name for name in _auto_preference() for s in statuses
                 if s.name == name and s.available), None)
    if args.json:
        print(json.dumps({"backends": [asdict(s) for s in statuses], "auto": auto}, indent=1))
        return 0
    width = max(len(s.name) for s in statuses)
    origin_width = max(len(s.origin) for s in statuses)
    for s in statuses:
        status = "available" if s.available else "unavailable"
        print(f"{s.name:<{width}}  {status:<11}  {s.origin:<{origin_width}}  {s.detail}")
    print(f"\n--backend auto picks: {auto or 'nothing (no backend of ' + ', '.join(_auto_preference()) + ' is available)'}")
    from conformance.backends.registry import shadowed

    for line in shadowed():
        print(f"note: {line}")
    return 0


def backend_statuses() -> list[BackendStatus]:
    """One status per backend: built-ins, installed plugins, then uninstalled examples."""
    from conformance.backends.registry import (BUILTIN, BackendError, availability_of,
                                               load_backend, registered)

    origins = _plugin_origins()
    statuses = []
    for name in registered():
        origin = "built-in" if name in BUILTIN else origins.get(name, "plugin")
        try:
            backend = load_backend(name)
        except BackendError as exc:  # a broken plugin must not hide the others
            statuses.append(BackendStatus(name, False, origin, str(exc)))
            continue
        availability = availability_of(backend)
        detail = backend.description if availability.available else availability.reason
        statuses.append(BackendStatus(name, availability.available, origin, detail))
    known = {s.name for s in statuses}
    for name, hint in EXAMPLE_PLUGINS.items():
        if name not in known:
            statuses.append(BackendStatus(name, False, "example plugin", hint))
    return statuses


def _plugin_origins() -> dict[str, str]:
    from importlib.metadata import entry_points

    from conformance.backends.registry import ENTRY_POINT_GROUP

    origins = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        origins[ep.name] = f"plugin {dist.name} {dist.version}" if dist else "plugin"
    return origins


def _auto_preference() -> tuple[str, ...]:
    from conformance.backends.registry import AUTO_PREFERENCE

    return AUTO_PREFERENCE
