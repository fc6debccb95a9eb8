"""Run by an interpreter of a venv that `pip install`ed hybridkv, from outside the source tree
and with no PYTHONPATH: the module, its stubs and its version come from the installed package."""
import os
import pathlib
import sys

import hybridkv

models, version = sys.argv[1], sys.argv[2]
module = pathlib.Path(hybridkv.__file__)
assert sys.prefix in str(module), f"hybridkv imported from {module}, not from the venv {sys.prefix}"
assert (module.parent / "__init__.pyi").is_file(), f"no __init__.pyi beside {module}"
assert list(module.parent.glob("_hybridkv*.so")), f"no compiled module beside {module}"
import hybridkv.vllm  # noqa: E402  (the adapter imports without vLLM)

assert hybridkv.vllm.KVCacheManager.allocate_slots
assert "PYTHONPATH" not in os.environ
assert hybridkv.__version__ == version, (hybridkv.__version__, version)

plan = hybridkv.make_plan(hybridkv.load_model(os.path.join(models, "ibm-ai-platform--Bamba-9B")),
                          memory="2GiB", max_model_len=4096)
mgr = hybridkv.KvCacheManager(plan.manager_config())
prompt = list(range(1, 101))
hits = []
for rid in (1, 2):
    mgr.add_request(rid, prompt)
    hit = mgr.lookup(rid)
    hits.append(hit.tokens)
    mgr.allocate(rid, len(prompt) - hit.tokens, hit)
    mgr.commit(rid, len(prompt))
    mgr.free(rid)
    mgr.check_invariants()
assert hits[0] == 0 and hits[1] > 0, hits
print(f"hybridkv {hybridkv.__version__} from {module.parent}: Bamba hits {hits}")
