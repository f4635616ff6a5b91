"""C2PA Content Credentials: read at the probe (in a sandboxed child), signed on publish."""
