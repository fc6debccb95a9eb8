"""Overlay helper: run a real vLLM source file in a stub module's namespace (used where a
shared stub replaced a module whose real code does import here, e.g. behind the
pydantic stand-in), or look up which layer a module came from."""
import os


def src_file(rel: str) -> str:
    return os.path.join(os.environ["VLLM_SRC"], rel)


def exec_real(rel: str, ns: dict) -> None:
    path = src_file(rel)
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    ns["__file__"] = path
    exec(code, ns)


def exec_real_dropping_imports(rel: str, ns: dict, drop: set) -> None:
    """Run a real vLLM file except its top-level imports from the modules in `drop`
    (the caller has put stand-ins for those names in `ns` first).  Everything else in
    the file -- classes, functions, constants -- is vLLM's own code, unmodified."""
    import ast
    path = src_file(rel)
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    body = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in drop:
            continue
        if isinstance(node, ast.Import) and any(a.name in drop for a in node.names):
            continue
        body.append(node)
    code = compile(ast.Module(body=body, type_ignores=[]), path, "exec")
    ns["__file__"] = path
    exec(code, ns)
