#!/usr/bin/env bash
# clang-format every C++ file of the project; --check only reports files that differ.
set -euo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc')
else
  # A source tarball without .git: every C++ file outside build output.
  mapfile -t files < <(find include src tools tests bench fuzz python \
    \( -name '*.h' -o -name '*.cc' \) 2>/dev/null | sort)
fi
if [ "${1:-}" = "--check" ]; then
  clang-format --dry-run --Werror "${files[@]}"
  echo "format: ${#files[@]} files clean"
else
  clang-format -i "${files[@]}"
fi
