"""The jobs that keep the system whole: the sweeper and its scans, GC, the integrity audit,
deletion and cancellation, backlog pressure, the outbox relay."""
