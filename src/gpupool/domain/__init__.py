"""Pure data and rules of gpupool: units, resources, jobs, states, nodes, pools, tenants, users.

Nothing in this package performs I/O, reads a clock or imports a higher layer.
"""
