"""aivedio: turns AI video provider outputs and uploads into published, playable assets."""

__version__ = "0.1.0"
