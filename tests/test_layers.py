"""The package imports downward only, and no module imports itself back through others.

Each folder of ``router/`` sits on a floor; a module may import one on a lower floor, or one of
its own folder. Every import counts, those the type checker alone sees (``if TYPE_CHECKING:``)
too: a cycle of types is a cycle. Two programs share the package, on one kernel: the lane
worker (``router/worker/``) imports the kernel alone, and the router reaches the worker only
through the command that runs it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROUTER = Path(__file__).resolve().parents[1] / "router"

# Longest prefix wins. Floor 0 are leaves: they import nothing of speclane's.
FLOORS: dict[str, int] = {
    "router": 0,  # __init__: the version
    # The kernel: what both programs (the router and the lane worker) import. Its leaves: the
    # contract between them, SSE, the system-message fold.
    "router.kernel.worker_contract": 0,
    "router.kernel.sse": 0,
    "router.kernel.system_messages": 0,
    # The router's leaves.
    "router.config.names": 0,
    "router.config.suggest": 0,
    "router.metrics": 0,
    "router.periodic": 0,
    "router.observability.escape": 0,
    # The request family: a pure leaf that both routing and speculation read.
    "router.speculation.families": 0,
    # The Responses door's state, held by the services below the doors.
    "router.frontdoors.responses_store": 0,
    "router.frontdoors.responses_running": 0,
    # The kernel's error core, request field rules and group rules.
    "router.kernel": 1,
    # The lane worker, bottom up, on the kernel alone: the request every layer reads; what
    # the model may emit (grammars, tool calls, stops); the draft sources and their choice;
    # the engines that run them; the distributed lane and the HTTP side on top; main.py
    # wiring them.
    "router.worker.request": 2,
    "router.worker.decoding": 3,
    "router.worker.drafting": 4,
    "router.worker.engines": 5,
    "router.worker.group": 6,
    "router.worker.http": 6,
    "router.worker": 7,
    # The router, bottom up. The upstream client: speaks HTTP/1.1 to upstreams, knows
    # nothing of the edge above it; the status page's history of the metrics.
    "router.upstream": 1,
    "router.history": 1,
    "router.config": 2,
    "router.routing": 3,
    "router.speculation": 3,
    "router.backends": 4,
    "router.lanes": 5,
    # The edge, with the services it hands every handler (router.proxy.services).
    "router.proxy": 6,
    "router.admin": 7,
    "router.bench": 7,
    "router.bench.common": 7,
    "router.frontdoors": 7,
    # Each benchmark reads the shared pieces below it, never another benchmark.
    "router.bench.scorecard": 8,
    "router.bench.overhead": 8,
    "router.bench.agent": 8,
    "router.bench.sources": 8,
    "router.bench.lanes": 8,
    "router.bench.cold": 8,
    "router.bench.prefill": 8,
    "router.bench.session": 8,
    "router.bench.distributed": 8,
    "router.observability": 8,
    "router.app": 9,
    "router.server": 10,
    # Every command's entry point: above the server it starts.
    "router.cli": 11,
    "router.__main__": 12,
}
# The one way from the router into the lane worker: the command that runs it.
WORKER_COMMAND = ("router.cli.worker", "router.worker.main")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROUTER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> tuple[int, str]:
    """(floor, the prefix that set it: the module's folder for this rule)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in FLOORS:
            return FLOORS[prefix], prefix
    raise AssertionError(f"{module} has no floor in FLOORS")


def imports(path: Path) -> set[str]:
    """Every module of ours ``path`` imports: at run time, inside a function, or for the
    type checker alone."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        is_ours = isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "router"
        if isinstance(node, ast.ImportFrom) and node.module and is_ours:
            found.add(node.module)
            if node.module == "router":
                found.update(f"router.{a.name}" for a in node.names if a.name != "__version__")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "router")
    return found


@functools.cache  # parsed once for the tests, which only read it
def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROUTER.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports(path):
            while imported not in modules and "." in imported:  # `from pkg import module`
                imported = imported.rsplit(".", 1)[0]
            if imported in modules and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def test_every_import_goes_down_a_floor_or_stays_in_its_folder() -> None:
    wrong = []
    for source, targets in graph().items():
        f_source, folder = floor(source)
        for target in targets:
            f_target, target_folder = floor(target)
            if f_target < f_source or target_folder == folder or target == "router":
                continue
            wrong.append(f"{source} (floor {f_source}) imports {target} (floor {f_target})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_no_import_cycle_between_folders() -> None:
    """Folders import each other one way only (``config`` does not import ``errors`` while
    ``errors`` reads ``config``'s header names). A floor-0 leaf imports nothing, so it closes
    no cycle: it counts on its own, not as part of its folder."""

    def room(module: str) -> str:
        return module if floor(module)[0] == 0 else ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for source, targets in graph().items():
        edges.setdefault(room(source), set()).update(
            room(t) for t in targets if room(t) != room(source)
        )
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            assert state.get(nxt) != 1, "folder cycle: " + " -> ".join(
                [*path[path.index(nxt) :], nxt] if nxt in path else [*path, nxt]
            )
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])


def test_floors_name_no_module_inside_a_folder_but_leaves() -> None:
    """A module inside a folder takes its folder's floor, unless it is a floor-0 leaf (a
    sub-folder, such as one benchmark of bench/, may have a floor of its own)."""
    folders = {m for m in graph() if "." in m and (ROUTER.parent / m.replace(".", "/")).is_dir()}
    for prefix, level in FLOORS.items():
        parent = prefix.rsplit(".", 1)[0]
        if parent in folders and parent != "router" and prefix not in folders:
            assert level == 0, f"{prefix} is floor {level} inside {parent}: only leaves may differ"


def program(module: str) -> str:
    """Which program a module belongs to: the kernel both share, the lane worker, the router;
    or the benchmarks (``speclane bench``), a development tool that drives both programs from
    outside and may read either (the prefill benchmark hands ``mlx_lm.server`` a body made by
    the worker's own parsing, so that both targets render the same text)."""
    for prefix in ("router.kernel", "router.worker", "router.bench"):
        if module == prefix or module.startswith(prefix + "."):
            return prefix.removeprefix("router.")
    return "router"


def test_the_kernel_imports_neither_program() -> None:
    wrong = [
        f"{source} imports {target}"
        for source, targets in graph().items()
        if program(source) == "kernel"
        for target in targets
        if program(target) != "kernel" and target != "router"
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_lane_worker_imports_only_itself_and_the_kernel() -> None:
    wrong = [
        f"{source} imports {target}"
        for source, targets in graph().items()
        if program(source) == "worker"
        for target in targets
        if program(target) not in ("worker", "kernel") and target != "router"
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_router_reaches_the_worker_only_through_its_command() -> None:
    wrong = [
        f"{source} imports {target}"
        for source, targets in graph().items()
        if program(source) == "router"
        for target in targets
        if program(target) == "worker" and (source, target) != WORKER_COMMAND
    ]
    assert not wrong, "\n".join(sorted(wrong))
    assert WORKER_COMMAND[1] in graph()[WORKER_COMMAND[0]]  # the rule names a real import


def test_type_checking_imports_count() -> None:
    """An import the type checker alone sees is an edge of the graph like any other."""
    assert "router.proxy.relay" in graph()["router.proxy.services"]
