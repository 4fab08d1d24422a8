"""The ember package reads top-down: ember-server imports the library and never the reverse, llama.py
is only the `Llama` front end (no helper hub that other modules import), and the library's shared
parts (chat, detokenizing, prompts) import no front end. Read from the source with `ast`, so a lazy
import inside a function counts too."""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "ember"

# Modules that may import ember.llama: the package's own __init__ (which exports Llama) and the
# front ends that make a Llama.
LLAMA_IMPORTERS = {"ember", "ember.cli"}
# Shared by every front end: none of them may import a front end or the server.
SHARED = ("ember.chat", "ember.detokenize", "ember.prompt", "ember.outputs", "ember.sampling_params")
FRONT_ENDS = ("ember.llama", "ember.llm", "ember.async_engine", "ember.engine_client", "ember.request_state",
              "ember.server")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: pathlib.Path) -> set:
    """The ember modules path imports (a name taken from a package counts as its submodule too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m == "ember" or m.startswith("ember.")}


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.fixture(scope="module")
def graph():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    return {module_name(f): imports_of(f) for f in files}


def test_relative_imports_resolve(graph):
    assert "ember.llama" in graph["ember"]
    assert "ember.chat" in graph["ember.server.app"] and "ember.server.args" in graph["ember.server.app"]
    assert "ember.chat.tool_calls" in graph["ember.chat"]


def test_only_the_server_imports_the_server(graph):
    offenders = {m: sorted(i for i in imports if within(i, "ember.server"))
                 for m, imports in graph.items() if not within(m, "ember.server")}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_llama_is_imported_only_where_a_llama_is_made(graph):
    importers = {m for m, imports in graph.items() if "ember.llama" in imports or
                 any(i.startswith("ember.llama.") for i in imports)}
    assert importers - {"ember.llama"} <= LLAMA_IMPORTERS


def test_shared_modules_import_no_front_end(graph):
    offenders = {m: sorted(i for i in imports if any(within(i, f) for f in FRONT_ENDS))
                 for m, imports in graph.items() if any(within(m, s) for s in SHARED)}
    assert {m: i for m, i in offenders.items() if i} == {}
