"""The server: the gRPC adapter, the replica process, its configuration, metrics and loops."""
