"""An asyncio client for Hubbub, the real-time chat service: one WebSocket kept open (jittered
reconnects, a heartbeat deadline), rooms rejoined without loss or duplicates, acked sends as
futures retried safely, and every server frame as a typed event.

```python
from hubbub_client import HubbubClient, Message

async with HubbubClient("ws://127.0.0.1:8000/ws", name="ada") as client:
    await client.join("lobby")
    await client.send("lobby", "hello")
    async for message in client.events(Message):
        print(f"{message.user}: {message.text}")
```
"""

from hubbub_client.client import (
    VERSION,
    AckFuture,
    EventStream,
    HubbubClient,
    TokenSource,
    backoff_delay,
    new_cid,
)
from hubbub_client.errors import (
    AckTimeoutError,
    ClientClosedError,
    ConnectionLostError,
    HubbubError,
    HubbubTimeoutError,
)
from hubbub_client.events import (
    DM,
    EVENT_TYPES,
    Ack,
    Attachment,
    Authenticated,
    BaseMessage,
    ClientError,
    ConnectionState,
    Conversation,
    Deleted,
    DirectMessage,
    Edited,
    Event,
    Hello,
    HistoryPage,
    Inbox,
    InboxEntry,
    Invited,
    Joined,
    Left,
    MemberChanged,
    Message,
    MessageEvent,
    Presence,
    Reaction,
    Receipt,
    Receipts,
    Resync,
    RoomInfo,
    RoomList,
    ServerError,
    StateChange,
    Typing,
    apply_event,
    display_name,
)
from hubbub_client.frames import (
    ERROR_CODES,
    TERMINAL_CLOSE_CODES,
    AttachmentFrame,
    FileFrame,
    FileId,
    SearchFrame,
    SearchResultFrame,
    UploadFrame,
)

__version__ = VERSION

__all__ = [
    "DM",
    "ERROR_CODES",
    "EVENT_TYPES",
    "TERMINAL_CLOSE_CODES",
    "VERSION",
    "Ack",
    "AckFuture",
    "AckTimeoutError",
    "Attachment",
    "AttachmentFrame",
    "Authenticated",
    "BaseMessage",
    "ClientClosedError",
    "ClientError",
    "ConnectionLostError",
    "ConnectionState",
    "Conversation",
    "Deleted",
    "DirectMessage",
    "Edited",
    "Event",
    "EventStream",
    "FileFrame",
    "FileId",
    "Hello",
    "HistoryPage",
    "HubbubClient",
    "HubbubError",
    "HubbubTimeoutError",
    "Inbox",
    "InboxEntry",
    "Invited",
    "Joined",
    "Left",
    "MemberChanged",
    "Message",
    "MessageEvent",
    "Presence",
    "Reaction",
    "Receipt",
    "Receipts",
    "Resync",
    "RoomInfo",
    "RoomList",
    "SearchFrame",
    "SearchResultFrame",
    "ServerError",
    "StateChange",
    "TokenSource",
    "Typing",
    "UploadFrame",
    "apply_event",
    "backoff_delay",
    "display_name",
    "new_cid",
]
