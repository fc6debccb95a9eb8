"""Builds the hybridkv Python package: its compiled module through CMake, its Python parts
(the re-exporting __init__, the vLLM adapter hybridkv.vllm) and type stubs from python/hybridkv.

The version is the one project(VERSION) in CMakeLists.txt declares. The build configures only
what the module needs (no connector, engine, CLI, tests), so it asks nothing of Debian beyond
g++, cmake, python3-dev, pybind11-dev, libfmt-dev and nlohmann-json3-dev. Environment:
  HKV_BUILD_TYPE              CMake build type (Release)
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (all cores)
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(hybridkv VERSION (\d+\.\d+\.\d+)", text).group(1)


class CMakeBuild(build_ext):
    """Builds the `hybridkv_python` CMake target and puts hybridkv/_hybridkv*.so in place."""

    def build_extension(self, ext):
        build_dir = Path(self.build_temp).resolve() / "cmake"
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            f"-DCMAKE_BUILD_TYPE={os.environ.get('HKV_BUILD_TYPE', 'Release')}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DHKV_BUILD_CONNECTOR=OFF", "-DHKV_BUILD_TESTS=OFF", "-DHKV_BUILD_BENCH=OFF",
            "-DHKV_BUILD_SHARED=OFF", "-DHKV_INSTALL=OFF", "-DHKV_WERROR=OFF",
        ]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "hybridkv_python",
                        "--parallel", jobs], check=True)

        built = sorted((build_dir / "python" / "hybridkv").glob("_hybridkv*.so"))
        if len(built) != 1:
            raise RuntimeError(
                f"expected one built module in {build_dir / 'python' / 'hybridkv'}, found {built}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    version=project_version(),
    ext_modules=[Extension("hybridkv._hybridkv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    packages=["hybridkv", "hybridkv.vllm"],
    package_dir={"": "python"},
    package_data={"hybridkv": ["*.pyi", "py.typed"]},
    zip_safe=False,
)
