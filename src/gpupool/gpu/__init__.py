"""GPU backends behind one protocol: NVML (nvidia-ml-py) and simulated devices."""
