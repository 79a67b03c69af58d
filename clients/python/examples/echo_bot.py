"""A bot that joins a room and answers every message starting with ``!echo`` with the rest
of it, as a reply:

    python clients/python/examples/echo_bot.py --url ws://127.0.0.1:8000/ws --name bot --room lobby

``--name`` is the bot's name on ``guest`` and ``names`` servers (on ``guest`` ones, pass
``--guest-key`` to stay the same guest across restarts); ``--token`` a JWT on ``jwt``
servers (or set HUBBUB_TOKEN). It runs until interrupted, reconnecting as needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os

from hubbub_client import HubbubClient, HubbubError, Message, StateChange

PREFIX = "!echo"

logger = logging.getLogger("echo_bot")


def answer_to(text: str) -> str | None:
    """What the bot says to ``text``: None unless it is an ``!echo`` command."""
    if text != PREFIX and not text.startswith(PREFIX + " "):
        return None
    return text[len(PREFIX) :].strip() or "(nothing to echo)"


async def run(
    url: str, room: str, name: str | None, guest_key: str | None, token: str | None
) -> None:
    client = HubbubClient(
        url, name=name, guest_key=guest_key, get_token=(lambda: token) if token else None
    )
    client.on(StateChange, lambda change: logger.info("connection %s", change.state))
    async with client, client.events(Message) as messages:
        me = client.user
        logger.info("connected as %s; joining %s", me, room)
        await client.join(room)
        async for message in messages:
            reply = answer_to(message.text)
            if message.room != room or message.user == me or reply is None:
                continue
            try:
                await client.send(room, reply, reply_to=message.id)
            except HubbubError as exc:
                logger.warning("could not answer %s: %s", message.id, exc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/ws")
    parser.add_argument("--room", default="lobby")
    parser.add_argument("--name", default="echo-bot")
    parser.add_argument("--guest-key", default=None)
    parser.add_argument("--token", default=os.environ.get("HUBBUB_TOKEN"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args.url, args.room, args.name, args.guest_key, args.token))


if __name__ == "__main__":
    main()
