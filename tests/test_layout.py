"""The code's shape: no import cycles, foreign internals only behind their seams, and every
third-party package the service imports declared as a dependency."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"

# Modules that reach below a dependency's public API, and the only places allowed to.
SEAMS = {
    "app.transport.uvicorn_seam": ("uvicorn.protocols", "uvicorn_worker", "websockets"),
    "app.redisio.redis_seam": ("redis.asyncio.connection", "redis.connection", "redis.utils"),
}
# Distribution names of the top-level modules that differ.
DISTRIBUTIONS = {"jwt": "pyjwt", "prometheus_client": "prometheus-client", "PIL": "pillow"}
# Namespace packages several distributions share: the longest prefix of the import names it.
NAMESPACE_DISTRIBUTIONS = {
    "opentelemetry": "opentelemetry-api",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
}


def _distribution(imported: str) -> str:
    """The distribution that provides module ``imported``."""
    parts = imported.split(".")
    for length in range(len(parts), 0, -1):
        found = NAMESPACE_DISTRIBUTIONS.get(".".join(parts[:length]))
        if found is not None:
            return found
    return DISTRIBUTIONS.get(parts[0], parts[0].replace("_", "-"))


# Allowed elsewhere: the websockets frame encoder (a public API) for the frame cache.
PUBLIC_EXCEPTIONS = {("app.transport.frames", "websockets.frames")}


def _modules() -> dict[str, Path]:
    found = {}
    for path in APP.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _runtime_imports(path: Path, typing_too: bool = False) -> Iterator[str]:
    """Modules imported when ``path`` is imported (not inside functions: those run later, when
    every module is loaded), and with ``typing_too`` those under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    body = list(tree.body)
    if typing_too:
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                body += node.body
    for node in body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for alias in node.names:  # `from app.broker import redis_scripts`
                yield f"{node.module}.{alias.name}"


def test_no_import_cycles_between_app_modules() -> None:
    """No module of app/ needs (indirectly) a module that needs it, not even for types."""
    modules = _modules()
    graph = {
        name: {dep for dep in _runtime_imports(path, True) if dep in modules and dep != name}
        for name, path in modules.items()
    }
    for name, deps in graph.items():  # a package's __init__ runs before its modules
        parent = name.rpartition(".")[0]
        if parent in modules and parent != "app":
            deps.add(parent)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_foreign_internals_are_only_used_behind_their_seams() -> None:
    """Only the seam modules import the private parts of uvicorn, uvicorn-worker, websockets
    and redis-py."""
    offenders = []
    for name, path in _modules().items():
        for imported in _runtime_imports(path):
            for seam, prefixes in SEAMS.items():
                public = {imported, imported.rpartition(".")[0]}
                if name == seam or any((name, m) in PUBLIC_EXCEPTIONS for m in public):
                    continue
                if any(imported == p or imported.startswith(p + ".") for p in prefixes):
                    offenders.append((name, imported))
    assert not offenders, offenders


def test_every_imported_package_is_a_declared_dependency() -> None:
    """Each third-party package app/ imports is in pyproject's dependencies (not only a dev
    or transitive one), so an install without dev dependencies runs the service. Imports
    under ``if TYPE_CHECKING`` (type stubs) are never run, and not counted."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {
        re.split(r"[\[<>=!~ ;]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]
    }
    modules = _modules()
    missing = set()
    for path in modules.values():
        tree = ast.parse(path.read_text())
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for imported in names:
                top = imported.split(".")[0]
                if top == "app" or top in __import__("sys").stdlib_module_names:
                    continue
                distribution = _distribution(imported)
                if distribution not in declared:
                    missing.add(distribution)
    assert not missing, missing


def test_the_seams_are_checked_against_what_is_installed_and_bounded() -> None:
    """Every dependency a seam relies on the internals of is declared with an upper bound,
    the installed version is the one the seam was checked against, and every fast path works
    with it."""
    from app.main import _unchecked_versions
    from app.redisio import redis_seam
    from app.transport import uvicorn_seam

    checked = uvicorn_seam.CHECKED_AGAINST | redis_seam.CHECKED_AGAINST
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounded = {
        re.split(r"[\[<>=!~ ;]", dep, maxsplit=1)[0].lower()
        for dep in project["dependencies"]
        if "<" in dep
    }
    assert set(checked) <= bounded, set(checked) - bounded
    assert _unchecked_versions(checked) == {}
    assert set(_unchecked_versions({"uvicorn": "0.0."})) == {"uvicorn"}  # it can tell
    paths = uvicorn_seam.fast_paths() | redis_seam.fast_paths()
    assert paths and all(paths.values()), paths
