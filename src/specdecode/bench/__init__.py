"""Benchmarks: workloads from held-out code, our methods and transformers' peers, tables, JSON, plots."""
