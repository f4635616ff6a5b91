"""``aivedio api``: provider callbacks, the videos API, status, playback and the player."""
