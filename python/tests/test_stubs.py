"""The type stubs beside the module describe exactly what it exports, and calls carry docs."""
import ast
import pathlib
import types

import hybridkv

STUBS = pathlib.Path(hybridkv.__file__).with_name("__init__.pyi")
ALIASES = {"ByteSize", "Tokens", "Ids"}  # typing helpers that exist only in the stubs


def stub_names():
    tree = ast.parse(STUBS.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {
                n.target.id if isinstance(n, ast.AnnAssign) else n.name
                for n in node.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            top.add(target.id)
    return top, members


def public(names):
    return {n for n in names if not n.startswith("__") or n in ("__contains__", "__len__")}


def test_stubs_sit_beside_the_module_and_match_its_exports():
    assert STUBS.exists()
    top, members = stub_names()
    # The package's own names: not its compiled module or subpackages (hybridkv.vllm).
    exported = {n for n in public(dir(hybridkv)) - {"__version__"}
                if not isinstance(getattr(hybridkv, n), types.ModuleType)}
    assert exported == top - ALIASES - {"__version__"}
    for cls, names in members.items():
        obj = getattr(hybridkv, cls)
        if issubclass(obj, BaseException):
            continue
        assert public(dir(obj)) - {"__init__"} == names - {"__init__"}, cls


def test_calls_have_docstrings():
    for name in ("load_model", "make_plan", "make_allocator", "generate_trace", "read_trace"):
        assert getattr(hybridkv, name).__doc__
    for name in ("lookup", "allocate", "block_table", "slot_mapping", "allocate_batch",
                 "block_tables", "step_slot_mapping", "compact", "check_invariants"):
        assert getattr(hybridkv.KvCacheManager, name).__doc__
    assert hybridkv.__doc__ and hybridkv.KvCacheManager.__doc__
