"""Top-level conftest: registers the suite's pytest plugin, which owns the options
(--backend, --profile, ...) and the supervised execution of the matrix."""
pytest_plugins = ["conformance.plugin"]
