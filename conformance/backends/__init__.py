"""Built-in backends and the registry (conformance/backends/registry.py)."""
