"""Generated protobuf and gRPC modules (see scripts/gen_protos.py)."""
