"""Measure: engine adapters, scraping, per-request stats, the tap and the Prometheus collectors."""
