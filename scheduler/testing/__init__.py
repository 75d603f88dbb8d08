"""What the tests and the benchmarks share, importable without path tricks:
the oracle (:mod:`.model`), real Redis topologies (:mod:`.redis_server`),
replica harnesses (:mod:`.replicas`).

Nothing in the runtime package imports this subpackage
(tests/test_layout.py checks it).
"""
