"""Every sandboxed process run: the sandbox, spawning, the probe and verdict runs, the media run."""
