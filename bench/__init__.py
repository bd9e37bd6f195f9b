"""Measurement kept beside the package and out of the wheel: the probes (bench/probes/) and the
device scripts that run them (bench/h200/). Run from the repository root:
`python -m bench.probes.NAME`."""
