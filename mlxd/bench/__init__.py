"""`mlxd bench`: mlxd and mlx-lm side by side on one model (in one process, or their
servers for `bench serve` and `bench prefix`); ratios with spread."""
