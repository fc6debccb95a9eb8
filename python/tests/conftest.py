"""Shared fixtures: the module under test, bundled model configs, the hkv CLI, small configs."""
import os
import pathlib

import pytest

import hybridkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = pathlib.Path(os.environ.get("HKV_MODELS", ROOT / "models"))


def model_path(name):
    return MODELS / name


@pytest.fixture
def hkv_bin():
    path = os.environ.get("HKV_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("HKV_BIN must name the built hkv binary (ctest sets it)")
    return path


def full_attention_config(num_blocks=9, block_tokens=4, max_model_len=64):
    """One pool of `num_blocks` (null block included), one full-attention group."""
    c = hybridkv.ManagerConfig()
    c.pool_blocks = [num_blocks]
    c.groups = [hybridkv.GroupConfig("all", block_tokens=block_tokens, pool=0)]
    c.max_model_len = max_model_len
    c.record_events = True
    return c


@pytest.fixture
def small():
    """A manager over 8 usable 4-token blocks with events on."""
    return hybridkv.KvCacheManager(full_attention_config())


@pytest.fixture(scope="session")
def bamba():
    return hybridkv.load_model(model_path("ibm-ai-platform--Bamba-9B"))


@pytest.fixture(scope="session")
def gemma2():
    return hybridkv.load_model(model_path("google--gemma-2-9b"))
