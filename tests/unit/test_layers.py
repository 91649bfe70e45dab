"""The package's import graph, function-level imports included, has no cycle.

A cycle held together by imports inside functions works until someone moves one of them; then
the package stops importing. Modules import downwards only: LAYERS below, explained (one line per
folder and module) in docs/ARCHITECTURE.md, which changes with it.
"""

from __future__ import annotations

import ast
import os
import re

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src", "lowband")


def module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(SRC))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


DYNAMIC = re.compile(r"^(lowband(?:\.\w+)+)(?::\w+)?$")


def imports_of(path: str, known: set[str]) -> set[str]:
    """The lowband modules `path` imports anywhere in its body (a package import names its __init__),
    and those it names in a string that is exactly a module or MODULE:FUNCTION: what
    importlib.import_module and the launcher's entry points import by name."""
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := DYNAMIC.match(node.value)):
            out.add(m.group(1))
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    paths = [os.path.join(d, f) for d, _, files in os.walk(SRC) for f in files if f.endswith(".py")]
    known = {module_name(p) for p in paths}
    edges = {module_name(p): imports_of(p, known) for p in paths}
    for name in edges:  # importing a.b.c runs a/__init__ and a/b/__init__ first
        # `from lowband import config` names the root package, which only re-exports lazily (lowband/__init__.py)
        edges[name] = {m for m in edges[name] if m not in (name, "lowband")}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)



# The layers, bottom to top: a module imports only from its own layer or below. A module belongs to
# the most specific entry that names it or one of its packages ("lowband.run.rundir" before "lowband.run").
LAYERS: list[list[str]] = [
    ["lowband.errors"],
    # leaves everyone uses: the name tables and the plug-in importer, the network as configured (links and
    # sites, no torch), the atomic file writer, the typed records, the SI-unit formatter, the path checks
    ["lowband.registry", "lowband.net", "lowband.atomic", "lowband.records", "lowband.units", "lowband.paths",
     "lowband.procs"],
    ["lowband.config"],
    ["lowband.comm", "lowband.data", "lowband.models"],  # the communicator; data sets; models
    # a run's files and processes, which methods and services use: run directory, checkpoints, worker
    # processes and their supervisor, warm starts, records, loggers, the lr schedule
    ["lowband.run"],
    ["lowband.distill"],  # losses, ensembles, and EDL-Dist's teacher service
    ["lowband.methods", "lowband.catalog"],  # one file per method; the catalog imports them all
    ["lowband.training"],  # one run: the loop and its teams, elastic jobs, session (start, resume)
    ["lowband.comparison"],  # a comparison of runs
    ["lowband.api", "lowband.wrapping", "lowband.wrapping_elastic", "lowband.cli", "lowband.cli_parser", "lowband.cli_distill",
     "lowband.__main__"],  # what users call
    ["lowband.integrations"],  # the trainers people use, each through wrap (imports its own library)
]


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """The index of the most specific layer entry naming `module` or a package above it (None: unlisted)."""
    best: tuple[int, int] | None = None
    for index, entries in enumerate(layers):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def upward_imports(edges: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """'a -> b' for every import of a module in a higher layer (the package root `lowband` is exempt:
    it imports nothing but lowband.errors, and `from lowband import config` names it)."""
    out = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets - {"lowband"}):
            low, high = layer_of(module, layers), layer_of(target, layers)
            if low is not None and high is not None and high > low:
                out.append(f"{module} -> {target}")
    return out


def test_the_layer_check_finds_a_planted_upward_import():
    edges = graph()
    edges["lowband.comm.communicator"] = edges["lowband.comm.communicator"] | {"lowband.comparison.table"}
    assert upward_imports(edges, LAYERS) == ["lowband.comm.communicator -> lowband.comparison.table"]


def test_a_module_named_in_a_string_counts_as_imported(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('import importlib\nimportlib.import_module("lowband.api")\nENTRY = "lowband.training.session:start"\n'
                    'NOTE = "lowband.api is the API"\n')
    assert imports_of(str(path), {"lowband.api", "lowband.training.session"}) == {"lowband.api", "lowband.training.session"}


def test_the_declared_layers_name_real_modules_once():
    entries = [e for layer in LAYERS for e in layer]
    known = set(graph()) | {m.rsplit(".", 1)[0] for m in graph()}
    assert len(entries) == len(set(entries)), "a module is declared in two layers"
    assert not [e for e in entries if e not in known], "layers naming no module (stale after a move?)"


def test_every_module_has_a_layer():
    unlisted = [m for m in graph() if m != "lowband" and layer_of(m, LAYERS) is None]
    assert not unlisted, "modules in no layer (add them to LAYERS): " + ", ".join(unlisted)


def test_modules_import_only_their_own_layer_or_below():
    upward = upward_imports(graph(), LAYERS)
    assert not upward, "upward imports (see LAYERS):\n" + "\n".join(upward)


SHARED_METHOD_PARTS = ("base", "outer", "rounds", "sparsifiers")  # method files: the registry


def undocumented(package: str) -> list[str]:
    """The modules of lowband.`package` its package docstring does not name (a method file is named by
    its registration instead, so for methods only the shared parts count)."""
    folder = os.path.join(SRC, package)
    with open(os.path.join(folder, "__init__.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    names = sorted(n[:-3] for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py")
    if package == "methods":
        names = [n for n in names if n in SHARED_METHOD_PARTS]
    return [n for n in names if not re.search(rf"\b{n}\b", doc)]


def test_no_folder_mixes_layers():
    """Every module of a folder sits in one layer (a folder is a layer, or inside one): the package's
    folders show its layers."""
    by_folder: dict[str, set[int]] = {}
    for module in graph():
        layer = layer_of(module, LAYERS)
        if module.count(".") >= 2 and layer is not None:
            by_folder.setdefault(module.rsplit(".", 1)[0], set()).add(layer)
    mixed = {folder: sorted(layers) for folder, layers in by_folder.items() if len(layers) > 1}
    assert not mixed, f"folders spanning layers: {mixed}"


def test_every_package_docstring_names_its_modules():
    packages = sorted(n for n in os.listdir(SRC) if os.path.isfile(os.path.join(SRC, n, "__init__.py")))
    assert {p: undocumented(p) for p in packages if undocumented(p)} == {}


def test_the_docstring_check_finds_a_module_left_out(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Holds alpha."""\n')
    (pkg / "alpha.py").write_text("")
    (pkg / "beta.py").write_text("")
    monkeypatch.setitem(globals(), "SRC", str(tmp_path))
    assert undocumented("pkg") == ["beta"]


def private_uses(path: str, known: set[str]) -> list[str]:
    """`module.NAME` lines where `path` takes a private name (one underscore) from another lowband module:
    imported by name, or read from a module it imported (`from lowband.run import launch; launch._x`)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lowband") and node.level == 0:
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    aliases.add(a.asname or a.name)
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.asname and a.name in known}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_takes_another_modules_private_name():
    """A name with one leading underscore is its module's own: another module that needs it needs a public name
    (issue 66: `launch._exit_code` read by the elastic job)."""
    paths = [os.path.join(d, f) for d, _, files in os.walk(SRC) for f in files if f.endswith(".py")]
    known = {module_name(p) for p in paths}
    taken = {module_name(p): uses for p in paths if (uses := private_uses(p, known))}
    assert not taken, taken


#: what starts a process; only lowband/procs.py may say it
STARTERS = re.compile(r"\bsubprocess\.(Popen|run|call|check_call|check_output)\(|\bos\.(fork|forkpty|spawn\w*|exec\w*)\(|"
                      r"\bfork_exec\b|\bmultiprocessing\b")


def starters(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [f"{os.path.relpath(path, SRC)}:{n}" for n, line in enumerate(f, 1)
                if STARTERS.search(line.split("#")[0])]


def test_one_module_starts_processes():
    """Every process lowband starts (workers, the warm server and its forks, teachers, Redis, joiners, `ip`)
    starts through lowband/procs.py, where the rule that a child dies with its parent is written once."""
    paths = [os.path.join(d, f) for d, _, files in os.walk(SRC) for f in files if f.endswith(".py")]
    found = [hit for p in paths if not p.endswith(os.path.join("lowband", "procs.py")) for hit in starters(p)]
    assert not found, found
    assert starters(os.path.join(SRC, "procs.py"))  # the check sees a starter where there is one


def test_the_starter_check_finds_a_popen(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("import subprocess\nsubprocess.Popen(['true'])  # starts one\nos.fork()\n")
    assert [hit.rsplit(":", 1)[1] for hit in starters(str(planted))] == ["2", "3"]

