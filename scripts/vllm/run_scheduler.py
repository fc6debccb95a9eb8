#!/usr/bin/python3
"""Drive vLLM's REAL v1 Scheduler (vllm/v1/core/sched/scheduler.py, unmodified) over a
trace (JSONL of design/replay.md), the way EngineCore does in synchronous mode:

  build a VllmConfig + KVCacheConfig for a model config (the builders of
  ../shared/vllm_reference/run_vllm_manager.py, imported, not restated), then
  get_kv_cache_configs -> generate_scheduler_kv_cache_config -> num_gpu_blocks,
  resolve_kv_cache_block_sizes, Scheduler = scheduler_config.get_scheduler_cls(),
  Scheduler(vllm_config, kv_cache_config, StructuredOutputManager, block_size, ...);
  per step: add the requests that arrived (add_request), schedule(), fabricate a
  ModelRunnerOutput (one sampled token per request that is not mid-prefill: the trace's
  next output token), update_from_output(); until every request finished.

  /usr/bin/python3 scripts/vllm/run_scheduler.py --trace T.jsonl \
      --config llama3_8b,bamba_9b_align --kv-gib 8 [--scheduler-cls module:Class] \
      [--manager module:Class] [--json-out out.json]

Per config it reports steps (schedule() calls while the engine has requests; steps_with_work
excludes the empty step EngineCore takes after the last request drains, which only
flushes finished_req_ids to the workers), preemptions, hit rate (first-admission local prefix-cache hit tokens
/ prompt tokens, read from the request's PrefillStats when it first appears in
scheduled_new_reqs), a digest of the finish events
(request id, output tokens), a digest of every block id handed to the model runner
(NewRequestData.block_ids / CachedRequestData.new_block_ids, in scheduling order -- the
same formula as run_vllm_manager.py's block_id_digest), scheduler time (schedule +
update_from_output) and KV-manager time (time inside the manager's public methods, by
wrapping them on the instance, plus KVCacheBlocks.get_block_ids) per step.
"""
from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import importlib
import inspect
import json
import os
import sys
import time
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_env  # noqa: E402

vllm_env.setup()

import torch  # noqa: E402,F401

import vllm.config as vcfg  # noqa: E402  (overlay: real Scheduler/CacheConfig)

# Reuse run_vllm_manager.py's model builders (it puts its stubs on sys.path; vllm is
# already imported through our layered finder, so that only affects non-vllm modules).
sys.path.insert(0, vllm_env.shared_reference_dir())
import run_vllm_manager as rvm  # noqa: E402

sys.path.remove(vllm_env.OVERLAY)
sys.path.insert(0, vllm_env.OVERLAY)

import vllm.v1.core.kv_cache_manager as kvm_mod  # noqa: E402
import vllm.v1.core.sched.scheduler as sched_mod  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402  (real, via overlay)
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    get_kv_cache_configs,
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

GiB = 1 << 30
M61 = (1 << 61) - 1


def load_obj(spec: str):
    mod, _, name = spec.partition(":")
    obj = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def install_manager(spec: str):
    """Replace KVCacheManager where the scheduler (and anything else) bound it."""
    orig = kvm_mod.KVCacheManager
    repl = load_obj(spec)
    top = repl.__module__.split(".")[0]
    for name, mod in list(sys.modules.items()):
        if mod is None or name == top or name.startswith(top + "."):
            continue
        d = getattr(mod, "__dict__", None) or {}
        for k, v in list(d.items()):
            if v is orig:
                d[k] = repl
    return repl


class Timer:
    """Accumulates time inside the public methods of one manager instance (outermost
    call only, so a public method calling another is not counted twice)."""

    def __init__(self):
        self.ns = 0
        self.calls: dict[str, int] = {}
        self.ns_by: dict[str, int] = {}
        self.depth = 0

    def wrap(self, name, fn):
        pc = time.perf_counter_ns

        @functools.wraps(fn)
        def timed(*a, **k):
            if self.depth:
                return fn(*a, **k)
            self.depth += 1
            t0 = pc()
            try:
                return fn(*a, **k)
            finally:
                dt = pc() - t0
                self.depth -= 1
                self.ns += dt
                self.calls[name] = self.calls.get(name, 0) + 1
                self.ns_by[name] = self.ns_by.get(name, 0) + dt
        return timed

    def calls_total(self) -> int:
        return sum(self.calls.values())


def timer_overhead_ns(rounds: int = 7, n: int = 100_000) -> float:
    """What the wrapper itself adds to each call it times: the mean a Timer records for a
    wrapped no-op, less what calling that no-op costs without the wrapper (a loop of direct
    calls, less the empty loop). Both managers' calls go through the same wrapper the same
    number of times, so the same correction applies to both; the median of `rounds` tries."""
    pc = time.perf_counter_ns
    obj = object()

    def noop(*a, **k):
        return None

    out = []
    for _ in range(rounds):
        probe = Timer()
        wrapped = probe.wrap("probe", noop)
        t0 = pc()
        for _ in range(n):
            pass
        empty = pc() - t0
        t0 = pc()
        for _ in range(n):
            noop(obj, 1, num_lookahead_tokens=0)
        direct = pc() - t0 - empty
        for _ in range(n):
            wrapped(obj, 1, num_lookahead_tokens=0)
        out.append(probe.ns / n - direct / n)
    out.sort()
    return out[len(out) // 2]


def wrap_manager(mgr, timer: Timer) -> list[str]:
    names = []
    for name, attr in inspect.getmembers(type(mgr)):
        if name.startswith("_") or isinstance(attr, property):
            continue
        if not callable(attr) or isinstance(attr, type):
            continue
        bound = getattr(mgr, name)
        setattr(mgr, name, timer.wrap(name, bound))
        names.append(name)
    return names


def make_args(ns) -> argparse.Namespace:
    """The option set run_vllm_manager.py's builders read."""
    return argparse.Namespace(
        block_size=ns.block_size, kv_gib=ns.kv_gib, max_model_len=ns.max_model_len,
        budget=ns.budget, max_num_seqs=ns.max_num_seqs,
        no_reserve_full_isl=ns.no_reserve_full_isl,
        mamba_cache_mode=ns.mamba_cache_mode, hash_algo=ns.hash_algo,
        log_stats=False, digest=True, _mamba_mode_override=None)


def build(name: str, a: argparse.Namespace):
    # The builders call SchedulerConfig(max_num_batched_tokens=..., max_num_seqs=...,
    # enable_chunked_prefill=True, scheduler_reserve_full_isl=...); vLLM's real
    # SchedulerConfig also needs its two InitVars, which EngineArgs passes from the
    # model config.
    rvm.SchedulerConfig = functools.partial(
        vcfg.SchedulerConfig, max_model_len=a.max_model_len, is_encoder_decoder=False)
    return rvm.CONFIGS[name](a)


def run_one(name: str, ns, trace: list[dict]) -> dict:
    a = make_args(ns)
    vc, specs, notes = build(name, a)
    if ns.scheduler_cls:
        mod, _, cls = ns.scheduler_cls.partition(":")
        vc.scheduler_config.scheduler_cls = f"{mod}.{cls}" if cls else mod
    # --- EngineCore._initialize_kv_caches
    kv_cache_configs = get_kv_cache_configs(vc, [specs], [int(ns.kv_gib * GiB)])
    kv_cache_config = generate_scheduler_kv_cache_config(kv_cache_configs)
    vc.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    if kv_cache_config.kv_cache_groups:
        vc.cache_config.block_size = min(
            g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)
    # --- EngineCore.__init__
    som = StructuredOutputManager(vc)
    SchedulerCls = vc.scheduler_config.get_scheduler_cls()
    sched_block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vc)
    scheduler = SchedulerCls(
        vllm_config=vc, kv_cache_config=kv_cache_config, structured_output_manager=som,
        include_finished_set=False, log_stats=False, block_size=sched_block_size,
        hash_block_size=hash_block_size)
    caching_hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
    init_none_hash(caching_hash_fn)
    block_hasher = get_request_block_hasher(hash_block_size, caching_hash_fn)

    mgr = scheduler.kv_cache_manager
    timer = Timer()
    wrapped = wrap_manager(mgr, timer)
    # KVCacheBlocks.get_block_ids is manager work the scheduler calls on the returned blocks;
    # a replacement manager's own subclasses (that override it) are timed the same way.
    blocks_classes = []
    todo = [kvm_mod.KVCacheBlocks]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "get_block_ids" in cls.__dict__:
            blocks_classes.append((cls, cls.__dict__["get_block_ids"]))
            cls.get_block_ids = timer.wrap("KVCacheBlocks.get_block_ids", cls.__dict__["get_block_ids"])

    pc = time.perf_counter_ns
    pending = deque(trace)
    reqs: dict[str, Request] = {}
    outputs: dict[str, list[int]] = {}
    got: dict[str, list[int]] = {}
    prompt_len: dict[str, int] = {}
    first_hit: dict[str, int] = {}
    step = steps = idle_skipped = empty_steps = 0
    sched_ns = update_ns = add_ns = 0
    step_mgr_ns: list[int] = []
    finish_digest = hashlib.sha256()
    finish_order_digest = 0
    block_digest = 0
    finished = 0
    sched_tokens = 0
    peak_running = 0
    gc.collect()
    gc.freeze()
    wall0 = time.perf_counter()
    try:
        while pending or scheduler.has_requests():
            while pending and pending[0]["arrival_step"] <= step:
                r = pending.popleft()
                rid = str(r["id"])
                out = r.get("output") or [(r["id"] * 7919 + i * 104729) % 32000
                                          for i in range(r["output_len"])]
                req = Request(request_id=rid, prompt_token_ids=r["prompt"],
                              sampling_params=SamplingParams(max_tokens=r["output_len"],
                                                             ignore_eos=True),
                              pooling_params=None, arrival_time=float(step),
                              block_hasher=block_hasher)
                t0 = pc()
                scheduler.add_request(req)
                add_ns += pc() - t0
                reqs[rid], outputs[rid], got[rid] = req, out, []
                prompt_len[rid] = len(r["prompt"])
            if not scheduler.has_requests():
                idle_skipped += pending[0]["arrival_step"] - step
                step = pending[0]["arrival_step"]
                continue
            m0 = timer.ns
            t0 = pc()
            so = scheduler.schedule()
            sched_ns += pc() - t0
            # --- block ids handed to the model runner, in scheduling order
            new_ids = {d.req_id: d.block_ids for d in so.scheduled_new_reqs}
            for rid in new_ids:  # first admission: the scheduler's PrefillStats
                if rid not in first_hit:
                    ps = reqs[rid].prefill_stats
                    first_hit[rid] = ps.num_local_cached_tokens if ps else 0
            cr = so.scheduled_cached_reqs
            cached_ids = dict(zip(cr.req_ids, cr.new_block_ids))
            order = list(so.num_scheduled_tokens)
            d = block_digest
            for rid in order:
                ids = new_ids[rid] if rid in new_ids else cached_ids.get(rid)
                d = (d * 1000003 + int(rid) + 2) % M61
                if ids is not None:
                    for g in ids:
                        for b in g:
                            d = (d * 1000003 + b + 2) % M61
                        d = (d * 1000003 + 1) % M61
                d = (d * 1000003 + 1) % M61
            block_digest = d
            sched_tokens += so.total_num_scheduled_tokens
            if so.total_num_scheduled_tokens == 0:
                empty_steps += 1
            peak_running = max(peak_running, len(scheduler.running))
            # --- fabricate the model runner output (schedule() already advanced
            #     num_computed_tokens; a request still mid-prefill samples nothing)
            sampled = []
            for rid in order:
                req = reqs[rid]
                if req.num_computed_tokens < req.num_tokens:
                    sampled.append([])
                else:
                    sampled.append([outputs[rid][req.num_output_tokens]])
            mro = ModelRunnerOutput(req_ids=order,
                                    req_id_to_index={r: i for i, r in enumerate(order)},
                                    sampled_token_ids=sampled)
            t0 = pc()
            eco = scheduler.update_from_output(so, mro)
            update_ns += pc() - t0
            for eo in eco.values():
                for o in eo.outputs:
                    got[o.request_id].extend(o.new_token_ids)
                    if o.finish_reason is not None:
                        finished += 1
                        toks = got[o.request_id]
                        finish_digest.update(
                            f"{o.request_id}:{','.join(map(str, toks))};".encode())
                        finish_order_digest = (finish_order_digest * 1000003
                                               + int(o.request_id) + 1) % (1 << 61)
            step_mgr_ns.append(timer.ns - m0)
            steps += 1
            step += 1
    finally:
        for cls, orig in blocks_classes:
            cls.get_block_ids = orig
        gc.unfreeze()
    wall = time.perf_counter() - wall0
    overhead = timer_overhead_ns()
    assert finished == len(trace), (finished, len(trace))
    for rid, toks in got.items():
        assert toks == outputs[rid][:len(toks)], rid
    hit = sum(first_hit.values())
    ptok = sum(prompt_len.values())
    preemptions = sum(r.num_preemptions for r in reqs.values())
    sv = sorted(step_mgr_ns)
    return dict(
        config=name, notes=notes,
        scheduler_cls=f"{SchedulerCls.__module__}.{SchedulerCls.__qualname__}",
        manager_cls=f"{type(mgr).__module__}.{type(mgr).__qualname__}",
        num_blocks=kv_cache_config.num_blocks, block_size=vc.cache_config.block_size,
        scheduler_block_size=sched_block_size, hash_block_size=hash_block_size,
        kv_groups=[(type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size,
                    len(g.layer_names)) for g in kv_cache_config.kv_cache_groups],
        steps=steps, steps_with_work=steps - empty_steps, empty_steps=empty_steps,
        idle_steps_skipped=idle_skipped, final_step=step,
        preemptions=preemptions, finished=finished,
        prefix_hit_rate=hit / max(ptok, 1), prefix_hit_tokens=hit, prompt_tokens=ptok,
        scheduled_tokens=sched_tokens, peak_running=peak_running,
        finish_digest=finish_digest.hexdigest()[:16],
        finish_order_digest=finish_order_digest,
        block_id_digest=block_digest,
        wall_s=wall,
        sched_total_s=(sched_ns + update_ns) / 1e9,
        sched_us_per_step=(sched_ns + update_ns) / 1e3 / max(steps, 1),
        schedule_us_per_step=sched_ns / 1e3 / max(steps, 1),
        update_us_per_step=update_ns / 1e3 / max(steps, 1),
        add_request_total_s=add_ns / 1e9,
        mgr_total_s=timer.ns / 1e9,
        mgr_calls=timer.calls_total(),
        timer_overhead_ns=overhead,
        mgr_net_us_per_step=(timer.ns - timer.calls_total() * overhead) / 1e3 / max(steps, 1),
        mgr_us_per_step=timer.ns / 1e3 / max(steps, 1),
        mgr_us_per_step_p50=(sv[len(sv) // 2] / 1e3) if sv else 0,
        mgr_us_per_step_p99=(sv[min(len(sv) - 1, int(len(sv) * 0.99))] / 1e3) if sv else 0,
        mgr_methods_wrapped=wrapped,
        per_method={k: dict(calls=timer.calls[k], total_ms=timer.ns_by[k] / 1e6)
                    for k in sorted(timer.calls)},
    )


COLS = [("config", "config", "{}"), ("blk", "block_size", "{}"),
        ("num_blocks", "num_blocks", "{}"), ("steps", "steps", "{}"),
        ("work_steps", "steps_with_work", "{}"),
        ("preempt", "preemptions", "{}"), ("hit_rate", "prefix_hit_rate", "{:.4f}"),
        ("peak_run", "peak_running", "{}"),
        ("sched_us/step", "sched_us_per_step", "{:.1f}"),
        ("mgr_us/step", "mgr_us_per_step", "{:.1f}"),
        ("mgr_net_us/step", "mgr_net_us_per_step", "{:.1f}"),
        ("finish_digest", "finish_digest", "{}"),
        ("block_id_digest", "block_id_digest", "{}"), ("wall_s", "wall_s", "{:.1f}")]


def table(results):
    rows = [[fmt.format(r[k]) for _, k, fmt in COLS] for r in results]
    w = [max(len(h), *(len(x[i]) for x in rows)) for i, (h, _, _) in enumerate(COLS)]
    lines = [" | ".join(h.ljust(n) for (h, _, _), n in zip(COLS, w)),
             "-+-".join("-" * n for n in w)]
    lines += [" | ".join(c.ljust(n) for c, n in zip(x, w)) for x in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--config", default="llama3_8b",
                    help="comma list of %s, or 'all'" % ",".join(rvm.CONFIGS))
    ap.add_argument("--kv-gib", type=float, default=16.0)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--no-reserve-full-isl", action="store_true")
    ap.add_argument("--mamba-cache-mode", default="all", choices=["all", "align"])
    ap.add_argument("--hash-algo", default="sha256",
                    choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
    ap.add_argument("--scheduler-cls", help="module:Class, installed as "
                    "SchedulerConfig.scheduler_cls (default: vLLM's Scheduler)")
    ap.add_argument("--manager", help="module:Class replacing KVCacheManager")
    ap.add_argument("--pythonpath", action="append", default=[],
                    help="extra import dirs (the built hybridkv package is always added)")
    ap.add_argument("--json-out")
    ns = ap.parse_args()
    for p in [vllm_env.hybridkv_python_dir()] + ns.pythonpath:
        if p not in sys.path:
            sys.path.insert(1, p)
    if ns.manager:
        install_manager(ns.manager)
    trace = rvm.load_trace(ns.trace)
    names = list(rvm.CONFIGS) if ns.config == "all" else ns.config.split(",")
    results = []
    for name in names:
        res = run_one(name, ns, trace)
        results.append(res)
        print(json.dumps({k: res[k] for k in (
            "config", "steps", "steps_with_work", "preemptions", "prefix_hit_rate", "finish_digest",
            "block_id_digest", "sched_us_per_step", "mgr_us_per_step", "mgr_net_us_per_step",
            "timer_overhead_ns", "wall_s")}),
            flush=True)
    print(table(results))
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            json.dump(dict(args=vars(ns), trace=rvm.trace_summary(trace),
                           results=results), f, indent=1)


if __name__ == "__main__":
    main()
