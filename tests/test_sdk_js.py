"""The TypeScript SDK (``clients/js``): it builds (strict TypeScript, ESM + CommonJS + types +
the browser bundle), the chat page's ``app/static/hubbub.js`` is exactly its bundle, the
package packs and loads both ways, its API docs build, and its Node suite passes against real
servers (one with a store; two on one Redis for a restart).

The Node packages come from ``make node-deps`` (``npm ci`` in ``clients/js``): without them
these tests fail, saying so, rather than skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from app.notify.webpush import generate_keys
from tests.helpers import make_settings, run_server
from tests.processes import ROOT, AppProcess, RedisServer

SDK = ROOT / "clients" / "js"
# The push service the Node suite's server allows (a name that resolves nowhere).
PUSH_SERVICE = "https://push.example.invalid/wp/"
pytestmark = pytest.mark.timeout(180)


def _node(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        ["node", *args], cwd=cwd, env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh build of the SDK in a copy of ``clients/js`` (the committed tree untouched)."""
    assert (SDK / "node_modules" / ".installed").exists(), "run `make node-deps` (npm ci)"
    copy = tmp_path_factory.mktemp("sdk") / "js"
    copy.mkdir()
    for name in (
        "src",
        "test",
        "scenarios",
        "package.json",
        "tsconfig.json",
        "typedoc.json",
        "build.mjs",
        "README.md",
    ):
        source = SDK / name
        if source.is_dir():
            shutil.copytree(source, copy / name)
        else:
            shutil.copy(source, copy / name)
    (copy / "node_modules").symlink_to(SDK / "node_modules")
    _node("build.mjs", cwd=copy, env={"HUBBUB_BUNDLE_OUT": str(copy / "bundle.js")})
    yield copy


def test_the_page_loads_the_sdks_bundle_as_built(built: Path) -> None:
    """One client, not two: ``app/static/hubbub.js`` is byte for byte the bundle a fresh build
    of ``clients/js`` makes (``npm run build`` there rewrites it)."""
    bundle = (built / "bundle.js").read_bytes()
    assert bundle.startswith(b"// hubbub-client ")
    assert (ROOT / "app" / "static" / "hubbub.js").read_bytes() == bundle, (
        "app/static/hubbub.js is not the SDK's build: run `npm run build` in clients/js"
    )


def test_the_package_packs_with_types_and_loads_as_esm_and_commonjs(
    built: Path, tmp_path: Path
) -> None:
    """``npm pack`` holds the ESM and CommonJS builds, their declarations and the browser
    bundle; installed from the tarball, ``import`` and ``require`` both give the client."""
    packed = subprocess.run(
        ["npm", "pack", "--silent", "--pack-destination", str(tmp_path)], cwd=built,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    with tarfile.open(tmp_path / packed) as archive:
        names = set(archive.getnames())
    for name in ("index.js", "index.cjs", "index.d.ts", "index.d.cts", "hubbub.min.js"):
        assert f"package/dist/{name}" in names, names
    assert not any("/src/" in name or "/test/" in name for name in names), names
    consumer = tmp_path / "consumer"
    consumer.mkdir()
    (consumer / "package.json").write_text('{"name": "consumer", "private": true}')
    # Offline: its dependencies from the SDK's own node_modules (npm's cache may hold their
    # tarballs but not the registry's metadata that resolving them from it needs).
    dependencies = json.loads((built / "package.json").read_text()).get("dependencies", {})
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--offline",
         *(str(SDK / "node_modules" / name) for name in dependencies), str(tmp_path / packed)],
        cwd=consumer, capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    required = "const c = require('hubbub-client'); console.log(typeof c.HubbubClient, c.VERSION)"
    assert _node("-e", required, cwd=consumer).split() == ["function", "0.1.0"]
    imported = "import('hubbub-client').then(c => console.log(typeof c.HubbubClient, c.VERSION))"
    assert _node("-e", imported, cwd=consumer).split() == ["function", "0.1.0"]


def test_the_api_docs_build_without_warnings(built: Path) -> None:
    """typedoc (warnings are errors) documents the public API."""
    _node("node_modules/typedoc/bin/typedoc", cwd=built)
    page = (built / "docs" / "classes" / "HubbubClient.html").read_text()
    assert (
        "sendTo" in page
        and "ackTimeoutMs"
        in (built / "docs").joinpath("interfaces", "ClientOptions.html").read_text()
    )


async def test_the_node_suite_passes_against_a_real_server(built: Path, tmp_path: Path) -> None:
    """``node --test`` (``clients/js/test/``) against a server with a store; with it, the tests
    of the chat page's message formatting (``app/static/format.js``)."""
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/chat.db",
        # Web Push on, with one push service allowed (nothing is pushed: the suite's one
        # subscription is gone before any notification is due).
        vapid_private_key=generate_keys()[0],
        push_services=[PUSH_SERVICE],
    )
    async with run_server(settings) as live:
        sdk = str(built / "dist/index.js")
        # format.test.mjs imports the page's app/static/format.js (not in the copy).
        fmt = str(ROOT / "app" / "static" / "format.js")
        proc = await asyncio.create_subprocess_exec(
            "node", "--test", "test/", cwd=built,
            env={
                **os.environ, "HUBBUB_URL": live.ws_url(), "HUBBUB_SDK": sdk,
                "HUBBUB_FORMAT": fmt, "HUBBUB_PUSH_SERVICE": PUSH_SERVICE,
            },
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "# fail 0" in text and "# skipped 0" in text, text
    assert int(text.split("# pass ")[1].split()[0]) >= 12, text
    passed = {line.split(" - ", 1)[1] for line in text.splitlines() if re.match(r"ok \d+ - ", line)}
    for name in (
        "a mention:",
        "notification levels:",
        "setVisible is taken",
        "setVisible is re",
        "block and mute:",
        "reports and previews:",
    ):
        assert any(test.startswith(name) for test in passed), (name, text)


async def test_the_sdk_comes_back_after_its_server_restarts(
    built: Path, redis_server: RedisServer
) -> None:
    """Server A is drained (1012) and restarted on its port while bob, on B, sends ten
    messages and ada writes one offline: ada's client reconnects by itself, rejoins with
    ``since``, shows every message once and in order, and its queued send is acked."""
    env = {"CHAT_REDIS_URL": redis_server.url, "CHAT_DRAIN_WINDOW_S": "0.2"}
    a, b = AppProcess(env), AppProcess(env)
    await a.start()
    await b.start()
    restarted: AppProcess | None = None
    proc = await asyncio.create_subprocess_exec(
        "node", "scenarios/restart.mjs", f"ws://127.0.0.1:{a.port}/ws", f"ws://127.0.0.1:{b.port}/ws",
        cwd=built, env={**os.environ, "HUBBUB_SDK": str(built / "dist/index.js")},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            assert await proc.stdout.readline() == b"ready\n"
            a.signal(signal.SIGTERM)
            await a.wait()
            proc.stdin.write(b"down\n")
            await proc.stdin.drain()
            assert await proc.stdout.readline() == b"sent\n"
            restarted = AppProcess(env, port=a.port)
            await restarted.start()
            proc.stdin.write(b"up\n")
            await proc.stdin.drain()
            result = json.loads(await proc.stdout.readline())
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for app in (a, b, restarted):
            if app is not None:
                await app.stop()
    assert result["texts"] == ["before", *(f"m{k}" for k in range(10)), "offline"], result
    assert result["ids_increasing"] and result["acked"], result
    assert "reconnecting:1012" in result["states"] and result["states"][-1] == "open", result


async def test_the_readme_front_end_example_works_as_written(built: Path, tmp_path: Path) -> None:
    """README's "Use it from your front end" example, run as it is (in Node, given the global
    WebSocket a browser has, against a live server): it prints the ack and the message."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use it from your front end", 1)[1]
    example = section.split("```js\n", 1)[1].split("```", 1)[0]
    async with run_server(make_settings()) as live:
        script = example.replace("ws://127.0.0.1:8000/ws", live.ws_url())
        script = script.replace('"hubbub-client"', json.dumps(str(built / "dist/index.js")))
        preamble = (
            f"import {{ WebSocket }} from {json.dumps(str(SDK / 'node_modules/ws/wrapper.mjs'))};\n"
        )
        preamble += "globalThis.WebSocket = WebSocket;\n"
        (tmp_path / "example.mjs").write_text(preamble + script)
        proc = await asyncio.create_subprocess_exec(
            "node", str(tmp_path / "example.mjs"), stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        lines: list[str] = []
        try:
            async with asyncio.timeout(20):
                while not (
                    any(line == "ada: hello" for line in lines)
                    and any("duplicate: false" in line for line in lines)
                ):
                    lines.append((await proc.stdout.readline()).decode().strip())
        finally:
            proc.kill()
            await proc.wait()


def test_the_sdks_frame_types_are_the_asyncapi_descriptions() -> None:
    """Every client and server frame type docs/asyncapi.yaml describes is typed in the SDK
    (``ClientFrame`` / ``ServerFrame`` in ``src/frames.ts``), and the SDK types none it does
    not: a frame added to the protocol and not to the SDK fails here."""
    document = yaml.safe_load((ROOT / "docs" / "asyncapi.yaml").read_text())
    schemas = document["components"]["schemas"]
    described: dict[str, set[str]] = {"client": set(), "server": set()}
    for name, message in document["components"]["messages"].items():
        schema = message["payload"]
        if "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
        side = "client" if name.startswith("client") else "server"
        described[side].add(schema["properties"]["type"]["const"])
    source = (SDK / "src" / "frames.ts").read_text()
    client_part, server_part = source.split("// -- server → client", 1)
    typed = {
        "client": set(re.findall(r'type: "(\w+)"', client_part)),
        "server": set(re.findall(r'type: "(\w+)"', server_part)) | {"ping", "pong"},
    }
    assert typed == described
