"""What the benchmarks share: the streaming client, process start and stop, the environment
record, statistics and tables, the agent workload and the synthetic upstream."""

# The client the scorecard's forced scenarios identify as (``X-Speclane-Client``); a router
# the bench starts gives it a policy of its own (``procs.POLICIES``).
BENCH_CLIENT = "speclane-bench"
