"""``python -m conformance.release_probe BACKEND``: the release this python would run BACKEND
with, as one line on stdout, ``FLEXCONF-RELEASE {json}``: the release keys a run records
(records/release.py), from the backend's own ``environment()``, which is what a run writes
into results.json. ``flexconf gate --confirm`` runs it under each side's python before it
measures anything again (reports/confirm_plan.py). Exit 2 with one line on stderr when the
backend cannot be loaded."""
from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    from conformance.backends.registry import BackendError, load_backend
    from records.release import PROBE_MARKER, release_of

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m conformance.release_probe BACKEND", file=sys.stderr)
        return 2
    try:
        environment = load_backend(argv[0]).environment()
    except BackendError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(PROBE_MARKER + json.dumps(release_of(environment)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
