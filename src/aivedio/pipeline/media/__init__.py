"""The pure media core, no I/O: what a file is, whether it is valid, the plan, and ffmpeg's
arguments."""
