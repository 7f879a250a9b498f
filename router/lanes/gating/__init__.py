"""Whether a target/draft pair may speculate: inspect, compare, decide."""
