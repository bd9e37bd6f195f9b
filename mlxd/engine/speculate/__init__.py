"""Speculative decoding in the batched step: prompt lookup and predicted outputs as drafts
(ngram.py), the gate that decides per step (gate.py), the verify step (verify.py) and the
per-row bookkeeping (drafting.py)."""
