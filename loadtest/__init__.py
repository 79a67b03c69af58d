"""Load generators and baseline servers for Hubbub's benchmarks (see docs/benchmarks.md)."""
