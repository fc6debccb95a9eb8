# Un-stub: the real vllm/config/kv_events.py imports fine behind the pydantic stand-in
# (the shared overlay has a plain-dataclass copy); run the real file here.
from vllm._real import exec_real

exec_real("config/kv_events.py", globals())
