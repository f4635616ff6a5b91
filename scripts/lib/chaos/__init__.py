"""The chaos harness behind ``scripts/chaos``: faults, crashes and outages, then invariants.

Modules: ``plan`` (the fault plan, deterministic from the seed, and what each fault calls
for), ``media`` (the source files), ``provider`` (the simulated provider as a process, with
the plan's faults), ``stack`` (the processes: PostgreSQL, S3 (SeaweedFS, from
``scripts/lib/seaweedfs.py``), provider, API, workers),
``load`` (callbacks, duplicates, cancels, deletes and the chaos schedule), ``checks`` (the
invariants, read from the database, the store and the logs) and ``main`` (the run and the
report).
"""
