"""`mlxd bench`: mlxd and mlx-lm side by side on one model in one process; ratios with spread."""
