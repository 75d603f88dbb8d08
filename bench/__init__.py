"""Benchmarks that measure this scheduler beside the alternatives, in one run.

``python -m bench {ceiling,balance,latency,throughput} [--json FILE] [--plot FILE.png]``;
see ``bench/__main__.py``.  One module per scenario, shared pieces in
``runner`` (Redis target, machine, tables, JSON), ``fleet`` (simulated
nodes), ``replicas`` (replica processes) and ``reference_model`` (the
reference design, for ``ceiling``).
"""
