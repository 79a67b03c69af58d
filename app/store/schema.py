"""The store's tables (SQLAlchemy Core). Changes go through a migration in
``app/store/migrations/versions`` (tests/test_store.py checks the two agree)."""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    false,
)
from sqlalchemy.dialects.postgresql import TSVECTOR

# Constraint names spelled out, so that migrations can refer to them on every database.
metadata: Final = MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    }
)

# One row per message, and per event on a message (an edit, a deletion, a reaction:
# app.conversations.lifecycle), the conversation's log. ``conversation`` is a room's name, or
# ``@<a>:<b>``
# for the direct messages between users a and b (a < b; no room name can start with ``@``);
# ``id`` is the id clients see (increasing within the conversation, below 2^53), so
# (conversation, id) is unique and archiving the same frame twice is a no-op. ``kind`` is an
# app.conversations.lifecycle.Kind; ``target`` the message a reply answers, or the one an event
# changes;
# ``text`` an event's new text, or its emoji. Deleting a message empties its text and its
# edits' (the rows stay: the log has no holes).
messages: Final = Table(
    "messages",
    metadata,
    Column("conversation", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("user", String(100), nullable=False),
    Column("text", Text, nullable=False),
    Column("ts_ms", BigInteger, nullable=False),
    Column("kind", SmallInteger, nullable=False, server_default="0"),
    Column("target", BigInteger, nullable=True),
    # A message's files, as its frame carries them (JSON: app.files.service); NULL for none.
    Column("attachments", Text, nullable=True),
    # The users a message mentions, as its frame carries them (a JSON list; "@here" for
    # ``here``: app.notify.mentions); NULL for none.
    Column("mentions", Text, nullable=True),
)
# Retention deletes by time.
Index("ix_messages_ts_ms", messages.c.ts_ms)
# A page of history folds the events on its messages. Partial: most rows are messages that
# answer nothing, and archiving them would maintain the index for nothing.
Index(
    "ix_messages_conversation_target",
    messages.c.conversation,
    messages.c.target,
    postgresql_where=messages.c.target.is_not(None),
    sqlite_where=messages.c.target.is_not(None),
)

# What each user has read: the id of the newest message they have seen in a conversation
# (unread counts are the messages after it).
read_state: Final = Table(
    "read_state",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("conversation", String(200), primary_key=True),
    Column("last_read_id", BigInteger, nullable=False),
)
# Where a room's readers are (`receipts` after every join): the furthest along first.
Index(
    "ix_read_state_conversation_last_read_id", read_state.c.conversation, read_state.c.last_read_id
)

# The conversations each user takes part in (their inbox): both users of a direct
# conversation, the authors of a room's messages, and whoever marked a room read.
participants: Final = Table(
    "participants",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("conversation", String(200), primary_key=True),
)

# Rooms made explicitly (a `create` frame, the backend API): a public room needs no row (any
# room a token allows can be joined); a private one is open to its members only. Rooms made
# by joining them have no row until someone gives them a title.
rooms: Final = Table(
    "rooms",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("private", Boolean, nullable=False),
    Column("title", String(200), nullable=False, server_default=""),
    Column("topic", Text, nullable=False, server_default=""),
    Column("created_by", String(100), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
)

# Who belongs to a room, and as what: owner, admin or member (app.conversations.rooms).
members: Final = Table(
    "members",
    metadata,
    Column("room", String(64), primary_key=True),
    Column("user", String(100), primary_key=True),
    Column("role", String(10), nullable=False),
    Column("added_ms", BigInteger, nullable=False),
)
# The rooms of a user.
Index("ix_members_user", members.c.user)

# What search reads (app.store.search): one row per message, with its text as it is now (its
# newest edit; ``version`` is the id of the row that text came from, so an edit archived twice
# or late never undoes a newer one), gone when the message is deleted or expires. Written by
# the search indexer from ``search_backlog``, off the delivery path and the archiver's
# transaction. On PostgreSQL ``document`` is the text's
# tsvector in CHAT_SEARCH_LANGUAGE (written with it), under a GIN index. On SQLite it lives in
# a file of its own, with an FTS5 index, ``search_fts``, kept in step by triggers
# (app.store.search_file), and ``document`` stays empty.
search_documents: Final = Table(
    "search_documents",
    metadata,
    Column("conversation", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("user", String(100), nullable=False),
    Column("ts_ms", BigInteger, nullable=False),
    Column("text", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("document", TSVECTOR().with_variant(Text(), "sqlite"), nullable=True),
)
# Newest first, and retention.
Index("ix_search_documents_ts_ms", search_documents.c.ts_ms)
Index(
    "ix_search_documents_document",
    search_documents.c.document,
    postgresql_using="gin",
    sqlite_where=search_documents.c.document.is_not(None),
)

# What the search indexer (app.store.search.SearchIndexer) has still to apply to
# ``search_documents``: the messages, edits and deletions the archiver stored (queued in its
# transaction, a row each, which costs it far less than indexing), oldest first; ``kind`` is
# the stored row's (app.conversations.lifecycle.Kind: 0 message, 1 edit, 2 deletion).
search_backlog: Final = Table(
    "search_backlog",
    metadata,
    Column("seq", BigInteger().with_variant(Integer(), "sqlite"), Identity(), primary_key=True),
    Column("conversation", String(200), nullable=False),
    Column("id", BigInteger, nullable=False),
    Column("kind", SmallInteger, nullable=False, server_default="0"),
)

# One row per upload (app.store.files): the conversation it is for, who uploaded it, its name
# and size as declared (``size``: as stored, once attached), its sniffed ``content_type`` and
# an image's dimensions and thumbnail. ``state``: 0 pending (an upload URL was handed out),
# 1 claimed (a send is attaching it), 2 attached (to ``message_id``). Pending and claimed rows
# older than CHAT_FILE_UPLOAD_TTL_S are orphans, deleted with their objects.
files: Final = Table(
    "files",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("conversation", String(200), nullable=False),
    Column("uploader", String(100), nullable=False),
    Column("name", String(255), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("content_type", String(100), nullable=False, server_default=""),
    Column("width", Integer, nullable=True),
    Column("height", Integer, nullable=True),
    Column("thumbnail", Boolean, nullable=False, server_default=false()),
    Column("state", SmallInteger, nullable=False),
    Column("message_id", BigInteger, nullable=True),
    # The cid of the send that claimed it: a retry of that send is answered with its message.
    Column("cid", String(80), nullable=True),
    Column("created_ms", BigInteger, nullable=False),
)
# Orphan sweeps.
Index("ix_files_state_created_ms", files.c.state, files.c.created_ms)
# The files of a message (deleting it deletes them).
Index("ix_files_conversation_message_id", files.c.conversation, files.c.message_id)
# A user's bytes kept (CHAT_USER_FILE_BYTES_MAX).
Index("ix_files_uploader", files.c.uploader)

# Each user's mentions (app.store.notifications): written by the archiver with the message,
# listed newest first, counted as unread after the user's read position. A deleted message's
# rows go with its text; retention removes them with the messages.
mentions: Final = Table(
    "mentions",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("conversation", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("ts_ms", BigInteger, nullable=False),
)
Index("ix_mentions_user_ts_ms", mentions.c.user, mentions.c.ts_ms)

# A user's notification level of a conversation (app.notify.rules.Level), and a mute until
# ``muted_until_ms``; no row: the default (rooms: mentions, direct conversations: all).
notification_levels: Final = Table(
    "notification_levels",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("conversation", String(200), primary_key=True),
    Column("level", SmallInteger, nullable=False),
    Column("muted_until_ms", BigInteger, nullable=True),
)
# The users who asked for every message of a room (queued as the archiver stores it).
Index(
    "ix_notification_levels_conversation_level",
    notification_levels.c.conversation,
    notification_levels.c.level,
)

# Per user and conversation: the pending notification (the newest message not notified yet,
# the strongest reason among those pending, when it is due, how many messages it tells of),
# when the last one was sent and up to which message it told of (a batch archived again
# queues nothing already told).
# Queued by the archiver in the transaction that stores the message; settled by the notifier
# (app.notify.notifier).
notify_state: Final = Table(
    "notify_state",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("conversation", String(200), primary_key=True),
    Column("pending_id", BigInteger, nullable=True),
    Column("reason", SmallInteger, nullable=True),
    Column("due_ms", BigInteger, nullable=True),
    Column("pending_count", Integer, nullable=False, server_default="0"),
    Column("sent_ms", BigInteger, nullable=False, server_default="0"),
    Column("notified_id", BigInteger, nullable=False, server_default="0"),
)
Index("ix_notify_state_due_ms", notify_state.c.due_ms)

# Web Push subscriptions (app.notify.webpush): a browser's endpoint and keys, for one user.
push_subscriptions: Final = Table(
    "push_subscriptions",
    metadata,
    Column("endpoint", String(2048), primary_key=True),
    Column("user", String(100), nullable=False),
    Column("p256dh", String(200), nullable=False),
    Column("auth", String(100), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
)
Index("ix_push_subscriptions_user", push_subscriptions.c.user)

# Who each user hides (app.access.hiding): ``target``'s messages are hidden from ``user``;
# ``blocked`` also keeps ``target`` from writing to ``user`` directly or inviting them.
hidden_users: Final = Table(
    "hidden_users",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("target", String(100), primary_key=True),
    Column("blocked", Boolean, nullable=False, server_default=false()),
    Column("created_ms", BigInteger, nullable=False),
)

# Reports of messages (app.moderation.reports): who reported which message, why, and what it
# said then; a moderator's decision once resolved. One report per reporter and message.
reports: Final = Table(
    "reports",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), Identity(), primary_key=True),
    Column("conversation", String(200), nullable=False),
    Column("message_id", BigInteger, nullable=False),
    Column("author", String(100), nullable=False),
    Column("text", Text, nullable=False),
    Column("reporter", String(100), nullable=False),
    Column("reason", String(500), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("resolved_ms", BigInteger, nullable=True),
    Column("resolved_by", String(100), nullable=True),
    Column("outcome", String(20), nullable=True),
)
Index(
    "ix_reports_reporter_conversation_message_id",
    reports.c.reporter,
    reports.c.conversation,
    reports.c.message_id,
    unique=True,
)
Index("ix_reports_resolved_ms_id", reports.c.resolved_ms, reports.c.id)
