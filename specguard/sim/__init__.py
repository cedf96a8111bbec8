"""The built-in engine simulator: speculative-decoding pools that speak vLLM, SGLang or llama.cpp exactly.

- ``config``: the YAML config (``default.yaml`` is shipped and documented).
- ``engine``: the engine model (continuous batching, verify rounds, step-cost model); no clock, no I/O.
- ``virtual``: the engine core in virtual time (no HTTP, no sleeping), for replays and cost tests.
- ``runtime``: the same core paced in (scaled) real time for the HTTP front ends.
- ``vllm_http`` / ``vllm_metrics``, ``sglang_http`` / ``sglang_metrics``, ``llamacpp_http`` /
  ``llamacpp_metrics``: the three dialects.
- ``server``: what the dialects' HTTP fronts share (plain endpoints, run-or-stream, SSE framing).
- ``truth``: what really happened, and the model's true relative cost per token.
- ``cluster``: ``SimCluster``, several pools on their own ports (``specguard simulate``).
"""
