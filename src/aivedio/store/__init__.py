"""Persistence: PostgreSQL (records, migrations, the job queue) and object storage."""
