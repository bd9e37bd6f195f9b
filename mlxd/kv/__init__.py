"""Layer 2: KV schemes (bf16, quantized, rotating, recurrent) and their batched forms.

Today mlx-lm's cache classes (mlx_lm.models.cache) are used as they are; mlxd's own schemes
land here with the KV issue. Imports point down: kv may import model, never engine or serve.
"""
