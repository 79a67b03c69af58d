"""Files attached to messages, on local disk and on a real S3-compatible server (SeaweedFS):
uploads by URL (presigned POST / signed PUT) within their declared size, attaching them to a
``send``, content types sniffed from the bytes, image thumbnails re-encoded, links only for
those who may read the conversation now and only until they expire, deleting a message
deletes its files, uploads never attached are swept, and a storage outage is a clear error
that leaves the chat working."""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from PIL import Image
from sqlalchemy import update

from app.store.schema import files
from tests.helpers import ChatClient, LiveServer, run_server
from tests.processes import S3Server
from tests.test_access import as_user, jwt_settings
from tests.test_durable import store_of, wait_stored
from tests.test_rooms import answer

pytestmark = pytest.mark.timeout(120)


def png(width: int = 640, height: int = 480) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(params=["local", "s3"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """The settings of each kind of file storage: local disk, and a real SeaweedFS."""
    if request.param == "local":
        yield {}
        return
    server = S3Server(tmp_path / "s3")
    await server.start()
    try:
        yield server.settings()
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def chat_with_files(
    tmp_path: Path, storage: dict[str, Any], **overrides: Any
) -> AsyncIterator[LiveServer]:
    async with run_server(jwt_settings(tmp_path, **storage, **overrides)) as live:
        yield live


async def upload(
    live: LiveServer, client: ChatClient, data: bytes, name: str = "cat.png", **target: Any
) -> str:
    """Upload ``data`` as the page does: ask for a URL, then PUT or POST to it; its id."""
    asked = await answer(
        client, {"type": "upload", "name": name, "size": len(data), **target}, "upload"
    )
    assert asked["type"] == "upload", asked
    response = await put_or_post(live, asked, data)
    assert response.status_code in (200, 201, 204), response.text
    return str(asked["file"])


async def put_or_post(live: LiveServer, asked: dict[str, Any], data: bytes) -> httpx.Response:
    url = str(asked["url"])
    if url.startswith("/"):
        url = live.http_url + url
    async with httpx.AsyncClient(timeout=10) as http:
        if asked["method"] == "PUT":
            return await http.put(url, content=data)
        return await http.post(url, data=asked["fields"], files={"file": ("blob", data)})


async def fetch(live: LiveServer, url: str) -> httpx.Response:
    if url.startswith("/"):
        url = live.http_url + url
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.get(url)


async def sent(client: ChatClient, frame: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send ``frame`` (with a cid): its ack and the message frame it made."""
    await client.send(frame)
    ack = message = None
    while ack is None or message is None:
        got = await client.next_frame(skip=("ping", "presence", "receipts"))
        if got["type"] == "error":
            raise AssertionError(got)
        if got["type"] == "ack":
            ack = got
        elif got["type"] == "message":
            message = got
    return ack, message


async def test_an_image_is_uploaded_attached_thumbnailed_and_read_by_members_only(
    tmp_path: Path, storage: dict[str, Any]
) -> None:
    """ada uploads a PNG to her private room and sends it: the message says what it is
    (sniffed, with its size and dimensions); members get links to it and a WebP thumbnail
    that fits the box; an outsider gets ``not_found`` for the file and for uploading there;
    bob, once removed, gets nothing more."""
    async with chat_with_files(tmp_path, storage) as live, as_user(live, "ada") as ada:
        await answer(ada, {"type": "create", "room": "vault", "private": True}, "room")
        await answer(ada, {"type": "invite", "room": "vault", "user": "bob"}, "room")
        await answer(ada, {"type": "join", "room": "vault"}, "joined")
        image = png()
        file_id = await upload(live, ada, image, room="vault")
        _, message = await sent(
            ada, {"type": "send", "room": "vault", "text": "look", "cid": "c1",
                  "attachments": [file_id]},
        )  # fmt: skip
        assert message["attachments"] == [
            {"id": file_id, "name": "cat.png", "size": len(image), "type": "image/png",
             "image": True, "width": 640, "height": 480}
        ]  # fmt: skip

        link = await answer(ada, {"type": "file", "id": file_id}, "file")
        assert link["type"] == "file" and link["expires"] > time.time()
        original = await fetch(live, link["url"])
        assert original.status_code == 200 and original.content == image
        assert original.headers["content-type"] == "image/png"
        assert original.headers["content-disposition"].startswith("inline")
        thumb = await fetch(live, link["thumbnail"])
        assert thumb.status_code == 200
        with Image.open(io.BytesIO(thumb.content)) as shown:
            assert shown.format == "WEBP" and max(shown.size) <= 320

        async with as_user(live, "eve") as eve:
            refused = await answer(eve, {"type": "file", "id": file_id}, "file")
            assert refused["code"] == "not_found"
            refused = await answer(
                eve, {"type": "upload", "room": "vault", "name": "x", "size": 3}, "upload"
            )
            assert refused["code"] == "not_found"

        async with as_user(live, "bob") as bob:
            link = await answer(bob, {"type": "file", "id": file_id}, "file")
            assert link["type"] == "file"
            await answer(ada, {"type": "remove", "room": "vault", "user": "bob"}, "room")
            refused = await answer(bob, {"type": "file", "id": file_id}, "file")
            assert refused["code"] == "not_found"

        # The stored message carries its files too (history past the broker's tail).
        await wait_stored(store_of(live), "vault", 1, timeout=10)
        stored = await store_of(live).before("vault", None, 10)
        assert file_id in (stored[0].attachments or "")


async def test_content_is_sniffed_and_never_served_as_a_page(
    tmp_path: Path, storage: dict[str, Any]
) -> None:
    """HTML named ``photo.png`` is not an image: no thumbnail, its type is what its bytes
    are, and it downloads as an octet stream to save, never inline; a PDF keeps its type."""
    async with chat_with_files(tmp_path, storage) as live, as_user(live, "ada") as ada:
        await answer(ada, {"type": "join", "room": "lobby"}, "joined")
        page = b"<html><body><script>alert(1)</script></body></html>"
        fake = await upload(live, ada, page, name="photo.png", room="lobby")
        pdf = await upload(
            live, ada, b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n", "a.pdf", room="lobby"
        )
        _, message = await sent(
            ada, {"type": "send", "room": "lobby", "text": "", "cid": 1, "attachments": [fake, pdf]}
        )
        first, second = message["attachments"]
        assert first["type"] == "text/html" and first["image"] is False and "width" not in first
        assert second["type"] == "application/pdf"
        link = await answer(ada, {"type": "file", "id": fake}, "file")
        assert link["thumbnail"] is None
        served = await fetch(live, link["url"])
        assert served.status_code == 200
        assert served.headers["content-type"].startswith("application/octet-stream")
        assert served.headers["content-disposition"].startswith("attachment")


async def test_uploads_keep_to_their_limits_and_attachments_to_their_owner(
    tmp_path: Path, storage: dict[str, Any]
) -> None:
    """Too large is refused before and during the upload; a file can be attached once, by
    its uploader, in its conversation; a retried send of the same files is acked with the
    same message; attaching a file never uploaded is ``not_found``."""
    async with (
        chat_with_files(tmp_path, storage, file_max_bytes=1000) as live,
        as_user(live, "ada") as ada,
        as_user(live, "bob") as bob,
    ):
        for client in (ada, bob):
            await answer(client, {"type": "join", "room": "lobby"}, "joined")
        refused = await answer(
            ada, {"type": "upload", "room": "lobby", "name": "big", "size": 1001}, "upload"
        )
        assert refused["code"] == "file_too_large"
        asked = await answer(
            ada, {"type": "upload", "room": "lobby", "name": "a", "size": 10}, "upload"
        )
        too_long = await put_or_post(live, asked, b"x" * 11)
        assert too_long.status_code in (400, 403, 413), too_long.text
        never = await answer(
            ada, {"type": "send", "room": "lobby", "text": "", "attachments": [asked["file"]]},
            "ack",
        )  # fmt: skip
        assert never["code"] == "not_found"

        mine = await upload(live, ada, b"hello there", name="a.txt", room="lobby")
        stolen = await answer(
            bob, {"type": "send", "room": "lobby", "text": "", "attachments": [mine]}, "ack"
        )
        assert stolen["code"] == "not_found"
        elsewhere = await answer(
            ada, {"type": "send", "to": "bob", "text": "", "cid": 9, "attachments": [mine]}, "ack"
        )
        assert elsewhere["code"] == "not_found"
        frame = {"type": "send", "room": "lobby", "text": "", "cid": "x", "attachments": [mine]}
        ack, _ = await sent(ada, frame)
        again = await answer(ada, frame, "ack")
        assert again == {"type": "ack", "cid": "x", "id": ack["id"], "duplicate": True}
        reused = await answer(ada, {**frame, "cid": "y"}, "ack")
        assert reused["code"] == "not_found"


async def test_deleting_the_message_deletes_its_files_and_unattached_uploads_are_swept(
    tmp_path: Path, storage: dict[str, Any]
) -> None:
    """After the message is deleted its file is gone: no link, and the link handed out
    before serves nothing. An upload never attached is deleted once older than the upload
    TTL; a newer one is kept; an attached file as old as retention goes too."""
    async with (
        chat_with_files(tmp_path, storage, retention_days=1) as live,
        as_user(live, "ada") as ada,
    ):
        await answer(ada, {"type": "join", "room": "lobby"}, "joined")
        image = png(50, 50)
        file_id = await upload(live, ada, image, room="lobby")
        ack, _ = await sent(
            ada, {"type": "send", "room": "lobby", "text": "", "cid": 1, "attachments": [file_id]}
        )
        link = await answer(ada, {"type": "file", "id": file_id}, "file")
        assert (await fetch(live, link["url"])).status_code == 200
        await answer(ada, {"type": "delete", "room": "lobby", "id": ack["id"], "cid": 2}, "ack")
        refused = await answer(ada, {"type": "file", "id": file_id}, "file")
        assert refused["code"] == "not_found"
        assert (await fetch(live, link["url"])).status_code in (403, 404)
        assert (await fetch(live, link["thumbnail"])).status_code in (403, 404)

        old = await upload(live, ada, b"forgotten", name="old.txt", room="lobby")
        new = await upload(live, ada, b"just now", name="new.txt", room="lobby")
        state = live.state
        assert state.store is not None and state.files is not None
        async with state.store.engine.begin() as connection:
            await connection.execute(update(files).where(files.c.id == old).values(created_ms=0))
        assert await state.files.sweep() == 1
        assert await state.files.storage.size(old) is None
        assert await state.files.storage.size(new) == len(b"just now")
        late = await answer(
            ada, {"type": "send", "room": "lobby", "text": "", "attachments": [old]}, "ack"
        )
        assert late["code"] == "not_found"

        await sent(ada, {"type": "send", "room": "lobby", "text": "", "cid": 3,
                         "attachments": [new]})  # fmt: skip
        assert await state.files.sweep() == 0  # attached, and young
        async with state.store.engine.begin() as connection:
            await connection.execute(update(files).where(files.c.id == new).values(created_ms=0))
        assert await state.files.sweep() == 1  # as old as retention
        assert await state.files.storage.size(new) is None
        expired = await answer(ada, {"type": "file", "id": new}, "file")
        assert expired["code"] == "not_found"


async def test_links_expire_and_cannot_be_altered(tmp_path: Path, storage: dict[str, Any]) -> None:
    """A link works until it expires, then is refused; a link altered (another object, or
    another type to serve it as) is refused."""
    async with (
        chat_with_files(tmp_path, storage, file_url_ttl_s=2) as live,
        as_user(live, "ada") as ada,
    ):
        await answer(ada, {"type": "join", "room": "lobby"}, "joined")
        file_id = await upload(live, ada, b"%PDF-1.4\n", name="a.pdf", room="lobby")
        await sent(
            ada, {"type": "send", "room": "lobby", "text": "", "cid": 1, "attachments": [file_id]}
        )
        link = await answer(ada, {"type": "file", "id": file_id}, "file")
        assert (await fetch(live, link["url"])).status_code == 200
        altered = link["url"].replace("application%2Fpdf", "text%2Fhtml")
        assert altered != link["url"]
        assert (await fetch(live, altered)).status_code == 403
        async with asyncio.timeout(10):
            while (await fetch(live, link["url"])).status_code == 200:
                await asyncio.sleep(0.25)
        assert (await fetch(live, link["url"])).status_code == 403


async def test_a_storage_outage_is_a_clear_error_and_the_chat_goes_on(
    tmp_path: Path, s3_server: S3Server
) -> None:
    """With the S3 store down, an upload to it fails, and a send with files is answered
    ``storage_unavailable`` (they stay the sender's to send again); text messages are
    delivered all along; once the store is back the same files are sent."""
    # The socket reads nothing while the store restarts (up to a minute on a loaded machine):
    # pings far enough apart that the heartbeat does not close it meanwhile (4009).
    quiet = {"heartbeat_interval_s": 600.0, "heartbeat_timeout_s": 300.0}
    async with (
        chat_with_files(tmp_path, s3_server.settings(), **quiet) as live,
        as_user(live, "ada") as ada,
    ):
        await answer(ada, {"type": "join", "room": "lobby"}, "joined")
        pdf = b"%PDF-1.4\nthe plan"
        file_id = await upload(live, ada, pdf, name="plan.pdf", room="lobby")
        await s3_server.kill()
        # A link is signed here, with no call to the store: the upload to it is what fails.
        asked = await answer(
            ada, {"type": "upload", "room": "lobby", "name": "b", "size": 5}, "upload"
        )
        with pytest.raises(httpx.ConnectError):
            await put_or_post(live, asked, b"bytes")
        frame = {"type": "send", "room": "lobby", "text": "", "cid": "f",
                 "attachments": [file_id]}  # fmt: skip
        refused = await answer(ada, frame, "ack")
        assert refused["code"] == "storage_unavailable"
        _, message = await sent(
            ada, {"type": "send", "room": "lobby", "text": "still here", "cid": "t"}
        )
        assert message["text"] == "still here"
        await s3_server.start()
        _, message = await sent(ada, frame)
        assert message["attachments"][0]["id"] == file_id
