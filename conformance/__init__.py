"""Runner, backends and the pytest matrix of the conformance suite."""
