"""``python -m loadtest.webhook_receiver``: a webhook receiver for ``loadtest/webhook_cost.sh``
(the tests' receiver, tests/webhook_receiver.py: it checks every signature). Prints its URL,
then every 5 s how many events it took and how many signatures it refused."""

from __future__ import annotations

import asyncio

from tests.webhook_receiver import running_receiver

SECRET = "h" * 40  # loadtest/webhook_cost.sh gives the servers the same


async def main() -> None:
    async with running_receiver(SECRET) as receiver:
        print(receiver.url, flush=True)
        while True:
            await asyncio.sleep(5)
            print(
                f"events {len(receiver.events)} refused {receiver.refused_signatures}", flush=True
            )


if __name__ == "__main__":
    asyncio.run(main())
