"""Isolation modes that enforce a slice on the node: exclusive, mps, shim, soft, mig."""
