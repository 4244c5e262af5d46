"""Stack bookkeeping: one stack per pool, its config, tags, leases, takedown and garbage collection."""
