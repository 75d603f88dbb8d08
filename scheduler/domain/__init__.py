"""The domain: tables and records, with no I/O and no Redis import."""
