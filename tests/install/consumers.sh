#!/usr/bin/env bash
# Out-of-tree consumers of an installed hybridkv (ctest runs each step as its own test):
#   consumers.sh install    SRC BUILD WORK   cmake --install BUILD into WORK/prefix
#   consumers.sh cmake      SRC BUILD WORK   find_package(hybridkv): shared, static, engine
#   consumers.sh components SRC BUILD WORK   components found, unknown/missing ones refused
#   consumers.sh headers    SRC BUILD WORK   every installed header compiles on its own
#   consumers.sh pkgconfig  SRC BUILD WORK   pkg-config hybridkv / hybridkv-engine
#   consumers.sh python     SRC BUILD WORK   pip install SRC into a fresh venv, run a script
set -euo pipefail
step=$1 src=$(realpath "$2") build=$(realpath "$3") work=$4
mkdir -p "$work"
work=$(realpath "$work")
prefix=$work/prefix
version=$(sed -n 's/^project(hybridkv VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
models=$prefix/share/hybridkv/models
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

case $step in
install)
  rm -rf "$prefix"
  cmake --install "$build" --prefix "$prefix" >/dev/null
  libdirs=("$prefix"/lib*/)
  libdir=${libdirs[0]}
  # Shared libraries carry the SONAME; the static ones are there too.
  soname=$(objdump -p "$libdir/libhkv_manager.so" | awk '/SONAME/ {print $2}')
  major_minor=${version%.*}
  [ "$soname" = "libhkv_manager.so.$major_minor" ] || { echo "SONAME $soname" >&2; exit 1; }
  test -f "$libdir/libhkv_manager.a"
  test -x "$prefix/bin/hkv"
  [ "$("$prefix/bin/hkv" --version)" = "hkv $version" ]
  echo "installed hybridkv $version into $prefix (SONAME $soname)"
  ;;
cmake)
  rm -rf "$work/cmake"
  cmake -S "$src/tests/install/consumer" -B "$work/cmake" "${generator[@]}" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$work/cmake" >/dev/null
  # The shared build must load the installed libraries, the static one none of them.
  # ldd's output is read whole before grep looks at it: with pipefail, `ldd | grep -q` fails at
  # random when grep exits at its first match and ldd, still writing, dies of SIGPIPE.
  libs=$(ldd "$work/cmake/manager_step")
  grep -q "$prefix/.*libhkv_manager.so" <<<"$libs"
  libs=$(ldd "$work/cmake/manager_step_static")
  if grep -q libhkv_ <<<"$libs"; then
    echo "manager_step_static loads a hybridkv shared library" >&2
    exit 1
  fi
  "$work/cmake/manager_step"
  "$work/cmake/manager_step_static"
  "$work/cmake/engine_verify"
  ;;
components)
  probe() {  # probe WANT EXPECTED-OUTCOME [MESSAGE]
    local out rc=0
    rm -rf "$work/components"
    out=$(cmake -S "$src/tests/install/components" -B "$work/components" "${generator[@]}" \
          -DCMAKE_PREFIX_PATH="$prefix" "-DWANT=$1" 2>&1) || rc=$?
    if [ "$2" = ok ] && [ $rc -ne 0 ]; then echo "$out" >&2; echo "components $1 refused" >&2; exit 1; fi
    if [ "$2" = refused ]; then
      [ $rc -ne 0 ] || { echo "components $1 accepted" >&2; exit 1; }
      grep -q "$3" <<<"$out" || { echo "$out" >&2; echo "no '$3' in the refusal" >&2; exit 1; }
    fi
    echo "components '$1': $2"
  }
  probe "core" ok
  probe "core;connector;engine;python" ok
  probe "engine" ok
  probe "core;bogus" refused "unknown hybridkv component 'bogus'"
  # A version the package is not compatible with (0.x: another minor).
  rm -rf "$work/components"
  mkdir -p "$work/v"
  sed 's/hybridkv 0.1 REQUIRED/hybridkv 0.99 REQUIRED/' "$src/tests/install/components/CMakeLists.txt" \
    >"$work/v/CMakeLists.txt"
  if cmake -S "$work/v" -B "$work/components" -DCMAKE_PREFIX_PATH="$prefix" -DWANT=core >/dev/null 2>&1; then
    echo "hybridkv 0.99 accepted" >&2
    exit 1
  fi
  echo "version 0.99: refused"
  ;;
headers)
  # Each public header alone, with only the installed include directory added: self-contained.
  find "$prefix/include/hkv" -name '*.h' | sort >"$work/headers"
  [ -s "$work/headers" ]
  sed "s|^$prefix/include/||" "$work/headers" | xargs -P "$(nproc)" -I{} sh -c \
    'printf "#include <%s>\n" "{}" | g++ -std=c++20 -fsyntax-only -Wall -Wextra -Werror \
       -I"$1/include" -x c++ - || { echo "does not compile alone: {}" >&2; exit 255; }' \
    _ "$prefix"
  # ... and including nothing but the standard library and other installed hybridkv headers
  # (a third-party header would make every consumer need that package).
  while read -r h; do
    { grep -o '^#include [<"][^>"]*[>"]' "$h" || true; } | sed 's/^#include [<"]\(.*\)[>"]/\1/' |
      while read -r inc; do
        case $inc in
        hkv/*) [ -f "$prefix/include/$inc" ] || { echo "$h includes $inc, not installed" >&2; exit 1; } ;;
        */* | *.*) echo "$h includes $inc: not the standard library" >&2; exit 1 ;;
        esac
      done
  done <"$work/headers"
  echo "$(wc -l <"$work/headers") installed headers compile on their own"
  ;;
pkgconfig)
  # From a moved copy of the prefix: the .pc files find their prefix from where they are.
  rm -rf "$work/moved"
  cp -a "$prefix" "$work/moved"
  prefix=$work/moved models=$work/moved/share/hybridkv/models
  export PKG_CONFIG_PATH
  pcdirs=("$prefix"/lib*/pkgconfig)
  PKG_CONFIG_PATH=${pcdirs[0]}
  [ "$(pkg-config --modversion hybridkv)" = "$version" ]
  libdir=$(pkg-config --variable=libdir hybridkv)
  mkdir -p "$work/pc"
  # shellcheck disable=SC2046  # pkg-config's flags are words
  g++ -std=c++20 -O1 -DMODELS_DIR="\"$models\"" "$src/tests/install/consumer/manager_step.cc" \
    -o "$work/pc/manager_step" $(pkg-config --cflags --libs hybridkv) -Wl,-rpath,"$libdir"
  # shellcheck disable=SC2046
  g++ -std=c++20 -O1 -DMODELS_DIR="\"$models\"" "$src/tests/install/consumer/engine_verify.cc" \
    -o "$work/pc/engine_verify" $(pkg-config --cflags --libs hybridkv-engine) -Wl,-rpath,"$libdir"
  libs=$(ldd "$work/pc/manager_step")
  grep -q "$prefix/.*libhkv_manager.so" <<<"$libs"
  "$work/pc/manager_step"
  "$work/pc/engine_verify"
  ;;
python)
  rm -rf "$work/venv"
  /usr/bin/python3 -m venv --system-site-packages "$work/venv"
  # --no-build-isolation: build with Debian's setuptools instead of fetching them; --no-index:
  # never reach for a package index.
  (cd "$src" && env -u PYTHONPATH "$work/venv/bin/pip" install --quiet --no-build-isolation \
     --no-index .)
  cd "$work"
  env -u PYTHONPATH "$work/venv/bin/python" "$src/tests/install/python_consumer.py" \
    "$src/models" "$version"
  ;;
*)
  echo "unknown step $step" >&2
  exit 2
  ;;
esac
