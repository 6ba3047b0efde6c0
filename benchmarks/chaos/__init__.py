"""python -m benchmarks.chaos [--out FILE.json] [--smoke]: the platform (two real replicas, daphne,
the billing consumer, private PostgreSQL and Redis) under steady streaming load from several
tenants while faults are injected one after another. See benchmarks/README.md ("chaos")."""
