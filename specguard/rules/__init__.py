"""Decide: policy schema, cost model (RC, baselines, what-if), the per-class guard state machine.

Pure computation on values: nothing here does I/O or imports ``monitor``.
"""
