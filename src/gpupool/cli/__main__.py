"""``python -m gpupool.cli`` runs the command line."""

from gpupool.cli.main import main

main()
