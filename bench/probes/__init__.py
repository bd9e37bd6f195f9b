"""Probes: one question about the engine's speed each, timed on a random-weight model of a real
shape (python -m bench.probes.NAME --help). Not shipped: `mlxd bench` runs from mlxd/bench/,
and nothing under mlxd/ imports these (the wheel does not ship them)."""
