"""Moderation beyond kicks and bans: reports of messages and their queue."""
