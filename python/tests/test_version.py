"""The module reports the one version the project declares, the same one `hkv --version` prints."""
import re
import subprocess

import hybridkv
from conftest import ROOT


def test_version_is_the_projects():
    declared = re.search(r"project\(hybridkv VERSION (\d+\.\d+\.\d+)",
                         (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert hybridkv.__version__ == declared


def test_version_is_the_clis(hkv_bin):
    out = subprocess.run([hkv_bin, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"hkv {hybridkv.__version__}"
