"""Conversations, whoever reads them: names of rooms and direct conversations
(:mod:`app.conversations.names`), history reaching into the store
(:mod:`app.conversations.history`), edits, deletions and reactions
(:mod:`app.conversations.lifecycle`), rooms with records, members and roles
(:mod:`app.conversations.rooms`). Who may see what is :mod:`app.access.conversations`."""
