"""Presence: who is in a room across every worker, and the announcements of arrivals and
departures."""
