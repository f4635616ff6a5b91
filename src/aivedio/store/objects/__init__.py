"""The object store seam (``base.py``) and its engines: the local filesystem and S3."""
