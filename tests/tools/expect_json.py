#!/usr/bin/python3
"""Run a command and check its exit code and the figures of the JSON it prints.

  expect_json.py [--exit N] [--check EXPR]... -- COMMAND ARGS...

EXPR is PATH OP VALUE with OP one of == != >= > <= <; PATH is dot-separated keys, a number
indexing a list, or key=value selecting the list element whose key has that value
(runs.allocator=vllm.steps). VALUE is JSON (42, 0.25, true, "text"). Every check must hold and
the exit code must be N (default 0); the first failure is printed and the script exits 1.
"""
import json
import operator
import re
import subprocess
import sys

OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le,
       ">": operator.gt, "<": operator.lt}


def select(doc, path):
    for part in path.split("."):
        if isinstance(doc, list):
            if "=" in part:
                key, value = part.split("=", 1)
                matches = [e for e in doc if str(e.get(key)) == value]
                if len(matches) != 1:
                    raise KeyError(f"{len(matches)} elements with {part}")
                doc = matches[0]
            else:
                doc = doc[int(part)]
        else:
            doc = doc[part]
    return doc


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("usage: expect_json.py [--exit N] [--check EXPR]... -- COMMAND ARGS...")
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    want_exit, checks = 0, []
    i = 0
    while i < len(opts):
        if opts[i] == "--exit":
            want_exit = int(opts[i + 1])
        elif opts[i] == "--check":
            checks.append(opts[i + 1])
        else:
            sys.exit(f"unknown option {opts[i]}")
        i += 2
    p = subprocess.run(command, capture_output=True, text=True)
    if p.returncode != want_exit:
        print(p.stdout[-2000:], p.stderr[-2000:], sep="\n")
        print(f"expect_json: FAILED: exit code {p.returncode}, expected {want_exit}")
        return 1
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        print(p.stdout[-2000:])
        print(f"expect_json: FAILED: the output is not JSON ({e})")
        return 1
    for check in checks:
        m = re.fullmatch(r"\s*(\S+?)\s*(==|!=|>=|<=|>|<)\s*(.+)", check)
        if not m:
            sys.exit(f"bad check {check!r}")
        path, op, value = m.groups()
        try:
            got = select(doc, path)
        except (KeyError, IndexError, ValueError, TypeError) as e:
            print(f"expect_json: FAILED: {path} not found ({e})")
            return 1
        want = json.loads(value)
        if not OPS[op](got, want):
            print(f"expect_json: FAILED: {path} is {got!r}, expected {op} {want!r}")
            return 1
    print(f"expect_json: OK ({len(checks)} checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
