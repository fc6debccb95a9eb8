# Un-stub: the real vllm/distributed/kv_events.py (event classes, KVEventBatch,
# EventPublisherFactory, ZMQ publisher) imports behind the msgspec stand-in and Debian's
# python3-zmq; the shared overlay has a dataclass copy without the publisher factory.
from vllm._real import exec_real

exec_real("distributed/kv_events.py", globals())
