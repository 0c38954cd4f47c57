"""Reports and the release gate: read results files, never torch."""
