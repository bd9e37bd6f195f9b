"""`mlxd bench`: side-by-side benchmarks against mlx-lm. Lands with the engine issue."""
