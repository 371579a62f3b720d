"""The ``gpupool`` command line (typer), one module per command group."""
