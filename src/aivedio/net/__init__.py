"""Network: the fetch policy, the pinning resolver and the guarded fetch."""
