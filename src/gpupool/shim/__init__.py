"""gpupool's CUDA driver shim: the C sources (``csrc/``) and their build (:mod:`.build`).

The shim holds a replica to its slice for any CUDA program: device memory counted against the
slice's limit on every allocation path, and kernel launches paced to its SM share. The region it
shares with the agent is handled on the Python side by :mod:`gpupool.runtime.shim`. See
docs/shim.md for the design.
"""
