"""Layer 2: KV schemes (bf16, quantized, rotating, recurrent) and their batched forms.

mlx-lm's cache classes (mlx_lm.models.cache) where they serve, and what mlx-lm lacks: the
batched quantized and quantized-ring caches, optiq's mixed per-layer schemes, the batch's roll
and row filters for CUDA. Imports point down: kv may import model, never engine or serve.
"""
