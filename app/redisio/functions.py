"""Redis Functions (``FUNCTION LOAD``, Redis 7.0): Lua libraries compiled once per server.

A script sent with ``EVALSHA`` runs its whole top level on every call: each helper function
it defines is made again, with its upvalues, and collected after. A library's top level runs
once, when it is loaded, and a call (``FCALL``) runs only the function it names. The
:class:`~app.redisio.autopipeline.AutoPipeline` calls a :class:`RedisFunction` as it calls a
script: it loads the library on each connection before the connection's first call of it
(``FUNCTION LOAD REPLACE``: a restarted server has none, a failed-over one has what was
replicated), and loads it again and reruns the call when Redis answers that the function is
not found (after a ``FUNCTION FLUSH``), as it does on ``NOSCRIPT``.

A library's name, and each function's, should carry a hash of its code, so that the workers
of two releases (a rolling deploy) each load and call their own, not one another's: function
names are global to a server.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RedisFunction:
    """The function ``name`` of the library ``library``, whose code (with its ``#!lua``
    line) is ``code``."""

    library: str
    name: str
    code: str

    @property
    def sha(self) -> str:
        """What the pipeline loads once per connection: the library (its functions share it)."""
        return self.library

    @property
    def load(self) -> tuple[str, ...]:
        """The command that loads (or replaces with the same code) the library."""
        return ("FUNCTION", "LOAD", "REPLACE", self.code)
