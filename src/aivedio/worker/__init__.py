"""The worker daemon: start and drain (``daemon.py``), each lane's slots and claimer
(``lanes.py``, ``claimers.py``), its leases: acknowledgements, heartbeat, release
(``leases.py``), the maintenance loop (``maintenance.py``), and its HTTP endpoint for
autoscalers (``health.py``)."""
