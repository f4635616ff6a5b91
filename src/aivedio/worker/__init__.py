"""The worker daemon: lanes, claimers, heartbeat and drain (``daemon.py``), and its HTTP
endpoint for autoscalers (``health.py``)."""
