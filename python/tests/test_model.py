"""Configs, plans and allocator modes from Python, and their errors."""
import pytest

import hybridkv
from conftest import model_path


def test_load_model_reads_the_layer_pattern(gemma2, bamba):
    assert gemma2.model_type == "gemma2"
    assert gemma2.num_layers == 42
    assert gemma2.layer_kinds[:2] == ["sliding_window", "full_attention"]
    assert gemma2.kv_bytes_per_token > 0
    assert bamba.state_bytes_per_sequence > 0
    assert "mamba2" in set(bamba.layer_kinds)
    assert "gemma2" in repr(gemma2)


def test_load_model_errors_name_the_file(tmp_path):
    with pytest.raises(hybridkv.NotFoundError) as e:
        hybridkv.load_model(tmp_path / "missing.json")
    assert "missing.json" in str(e.value)
    assert isinstance(e.value, LookupError) and isinstance(e.value, hybridkv.Error)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(hybridkv.ParseError) as e:
        hybridkv.load_model(bad)
    assert "config.json" in str(e.value)
    bad.write_text('{"model_type": "llama", "num_hidden_layers": -3}')
    with pytest.raises(hybridkv.Error) as e:
        hybridkv.load_model(bad)
    assert "num_hidden_layers" in str(e.value)


def test_make_plan_and_its_manager_config(bamba):
    plan = hybridkv.make_plan(bamba, memory="16GiB", max_model_len=16384)
    assert plan.block_tokens == 16 and plan.max_model_len == 16384
    assert plan.num_groups >= 2 and plan.num_page_classes == 2
    assert plan.strategy
    assert plan.max_sequences(16384) > plan.max_sequences_uniform(16384)
    cfg = plan.manager_config()
    cfg.validate()
    assert len(cfg.pool_blocks) == 2
    assert [g.kind for g in cfg.groups].count("state") == 1
    same = hybridkv.ManagerConfig.from_plan(plan)
    assert same.pool_blocks == cfg.pool_blocks
    # A byte count works as well as text; bad budgets raise with the value named.
    assert hybridkv.make_plan(bamba, memory=16 << 30, max_model_len=16384).num_pages == plan.num_pages
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        hybridkv.make_plan(bamba, memory="16 parsecs")
    assert "parsecs" in str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(hybridkv.InvalidArgumentError):
        hybridkv.make_plan(bamba, memory=-1)
    with pytest.raises(hybridkv.ResourceExhaustedError) as e:
        hybridkv.make_plan(bamba, memory="1MiB", max_model_len=16384)
    assert "1.00 MiB" in str(e.value) and "one sequence" in str(e.value)


def test_allocator_modes_side_by_side(bamba):
    modes = {m: hybridkv.make_allocator(bamba, m, memory="16GiB") for m in
             ("uniform", "padded", "hybridkv")}
    assert modes["hybridkv"].block_tokens == 16
    assert modes["padded"].block_tokens > 16  # vLLM's rule grows the block to hold a state page
    assert modes["hybridkv"].max_sequences(1000) > modes["padded"].max_sequences(1000)
    assert modes["hybridkv"].config.num_slabs > 0  # two-level memory
    assert modes["hybridkv"].bytes_per_sequence(1000) < modes["padded"].bytes_per_sequence(1000)
    for m, a in modes.items():
        assert a.mode == m and a.summary
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        hybridkv.make_allocator(bamba, "fancy")
    assert "fancy" in str(e.value)


def test_hand_made_config_is_validated():
    c = hybridkv.ManagerConfig()
    c.pool_blocks = [8]
    c.groups = [hybridkv.GroupConfig("window", block_tokens=4, pool=3, span=8)]
    c.max_model_len = 64
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        c.validate()
    assert "pool" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError):
        hybridkv.KvCacheManager(c)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        hybridkv.GroupConfig("sideways")
    assert "sideways" in str(e.value)
    g = hybridkv.GroupConfig("window", block_tokens=4, pool=0, span=8, sinks=2)
    assert (g.kind, g.block_tokens, g.pool, g.span, g.sinks) == ("window", 4, 0, 8, 2)
    assert "window" in repr(g)
    c.groups = [g]
    c.validate()
    assert c.hash_tokens == 4 and c.align_tokens == 4
    for name in ("checkpoint_interval", "max_interval_checkpoints", "state_align_tokens",
                 "max_encoder_tokens", "rolling_stride_after_give_back", "branch_memory_entries",
                 "branch_bonus_levels"):
        setattr(c, name, 3)
        assert getattr(c, name) == 3
    c.branch_bonus = 0.5
    assert c.branch_bonus == 0.5
    for name in ("enable_prefix_caching", "demote_superseded_checkpoints", "drop_last_hit_block",
                 "coherent_eviction", "evict_uncovered", "prompt_checkpoints", "record_events"):
        setattr(c, name, False)
        assert getattr(c, name) is False
    assert c.publish_at_allocate is False
    c.publish_at_allocate = True
    assert c.publish_at_allocate is True
    assert c.num_slabs == 0 and c.pages_per_slab == []


def test_model_path_helper_points_at_bundled_configs():
    assert model_path("google--gemma-2-9b").exists()
