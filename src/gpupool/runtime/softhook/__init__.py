"""The folder put first on a soft-isolated job's ``PYTHONPATH``; see ``sitecustomize``."""
