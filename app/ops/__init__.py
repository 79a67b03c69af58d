"""Operations: what the service tells the people who run it.

Prometheus metrics and their endpoint, log lines, the garbage collector's tuning and pause
measurements, and the container health check.
"""
