"""What every benchmark shares: the streaming client, process start and stop, CPU
accounting, the environment record, small statistics and the synthetic upstream."""

# The client the scorecard's forced scenarios identify as (``X-Speclane-Client``); a router
# the bench starts gives it a policy of its own (``procs.POLICIES``).
BENCH_CLIENT = "speclane-bench"
