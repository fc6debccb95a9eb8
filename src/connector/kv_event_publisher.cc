// KvEventPublisher: batches over a ZeroMQ XPUB socket, and a replay ROUTER served by a thread.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <zmq.h>

#include <hkv/connector/kv_events.h>

namespace hkv {
namespace {

void BigEndian(int64_t v, unsigned char out[8]) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<unsigned char>(u >> (56 - 8 * i));
}

int64_t FromBigEndian(const unsigned char* p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i)
    u = (u << 8) | p[i];
  return static_cast<int64_t>(u);
}

std::string LastEndpoint(void* socket) {
  char buf[256];
  size_t len = sizeof(buf);
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return "";
  return std::string(buf, strnlen(buf, len));
}

// Sends parts as one multipart message; false on any failure.
bool SendParts(void* socket, std::initializer_list<std::pair<const void*, size_t>> parts) {
  size_t i = 0;
  for (const auto& [data, size] : parts) {
    const int flags = ++i < parts.size() ? ZMQ_SNDMORE : 0;
    if (zmq_send(socket, data, size, flags) < 0) return false;
  }
  return true;
}

}  // namespace

struct KvEventPublisher::State {
  ~State();
  void ServeReplay();

  KvEventPublisherOptions options;
  std::vector<KvEventGroup> groups;
  void* context = nullptr;
  void* pub = nullptr;
  void* replay = nullptr;
  std::string endpoint, replay_endpoint;
  bool subscribed = false;
  mutable std::mutex mu;  // guards buffer and sequence (the replay thread reads them)
  // Batches shared with the replay thread, which copies only the pointers under `mu` and sends
  // outside it, so a replay from sequence 0 never holds up Publish.
  std::deque<std::pair<int64_t, std::shared_ptr<const std::vector<unsigned char>>>> buffer;
  int64_t replays_refused = 0;  // malformed or oversized requests (replay thread only)
  int64_t sequence = 0;
  std::atomic<bool> stop{false};
  std::thread replay_thread;
};

KvEventPublisher::KvEventPublisher(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Bind(
    const KvEventPublisherOptions& options, std::vector<KvEventGroup> groups) {
  if (options.endpoint.empty()) {
    return Status::InvalidArgument("kv events: the endpoint is empty: expected an address");
  }
  if (options.topic.empty()) {
    return Status::InvalidArgument("kv events: the topic is empty: expected a name");
  }
  auto p = std::make_unique<State>();
  p->options = options;
  p->groups = std::move(groups);
  p->context = zmq_ctx_new();
  p->pub = zmq_socket(p->context, ZMQ_XPUB);
  const int linger = 0;
  zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof(linger));
  if (zmq_bind(p->pub, options.endpoint.c_str()) != 0) {
    return Status::IoError(fmt::format("kv events: cannot bind the publisher to {}: {}",
                                       options.endpoint, zmq_strerror(zmq_errno())));
  }
  p->endpoint = LastEndpoint(p->pub);
  if (!options.replay_endpoint.empty()) {
    p->replay = zmq_socket(p->context, ZMQ_ROUTER);
    zmq_setsockopt(p->replay, ZMQ_LINGER, &linger, sizeof(linger));
    // A request is an 8-byte sequence number: ZeroMQ drops a peer that sends a larger message
    // before any of it is buffered here.
    const int64_t max_message = kMaxReplayRequestBytes;
    zmq_setsockopt(p->replay, ZMQ_MAXMSGSIZE, &max_message, sizeof(max_message));
    if (zmq_bind(p->replay, options.replay_endpoint.c_str()) != 0) {
      return Status::IoError(fmt::format("kv events: cannot bind the replay socket to {}: {}",
                                         options.replay_endpoint, zmq_strerror(zmq_errno())));
    }
    p->replay_endpoint = LastEndpoint(p->replay);
    p->replay_thread = std::thread([q = p.get()] { q->ServeReplay(); });
  }
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(p)));
}

KvEventPublisher::~KvEventPublisher() = default;

KvEventPublisher::State::~State() {
  stop = true;
  if (replay_thread.joinable()) replay_thread.join();
  if (replay != nullptr) zmq_close(replay);
  if (pub != nullptr) zmq_close(pub);
  if (context != nullptr) zmq_ctx_term(context);
}

const std::string& KvEventPublisher::endpoint() const {
  return state_->endpoint;
}

const std::string& KvEventPublisher::replay_endpoint() const {
  return state_->replay_endpoint;
}

bool KvEventPublisher::WaitForSubscriber(int timeout_ms) {
  State& st = *state_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!st.subscribed) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    zmq_pollitem_t item{st.pub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, static_cast<long>(left)) <= 0) continue;
    unsigned char msg[256];
    const int n = zmq_recv(st.pub, msg, sizeof(msg), ZMQ_DONTWAIT);
    if (n > 0 && msg[0] == 1) st.subscribed = true;  // 1: subscribe, 0: unsubscribe
  }
  return true;
}

int64_t KvEventPublisher::next_sequence() const {
  std::lock_guard lock(state_->mu);
  return state_->sequence;
}

Status KvEventPublisher::Publish(std::span<const ManagerEvent> events,
                                 const RequestTokens& tokens) {
  return Publish(events, tokens, state_->options.encoding.medium);
}

Status KvEventPublisher::Publish(std::span<const ManagerEvent> events, const RequestTokens& tokens,
                                 std::string_view medium) {
  if (events.empty()) return Status::Ok();
  State& st = *state_;
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  KvEventEncoding encoding = st.options.encoding;
  encoding.medium = std::string(medium);
  HKV_ASSIGN_OR_RETURN(std::vector<unsigned char> payload,
                       EncodeKvEventBatch(events, st.groups, tokens, encoding, ts));
  // Subscription messages queue on an XPUB socket: read them so they never pile up.
  unsigned char sub[256];
  while (zmq_recv(st.pub, sub, sizeof(sub), ZMQ_DONTWAIT) > 0) {
    if (sub[0] == 1) st.subscribed = true;
  }
  int64_t seq = 0;
  {
    std::lock_guard lock(st.mu);
    seq = st.sequence++;
  }
  unsigned char seq_bytes[8];
  BigEndian(seq, seq_bytes);
  const bool sent = SendParts(st.pub, {{st.options.topic.data(), st.options.topic.size()},
                                       {seq_bytes, 8},
                                       {payload.data(), payload.size()}});
  if (st.replay != nullptr) {
    auto shared = std::make_shared<const std::vector<unsigned char>>(std::move(payload));
    std::lock_guard lock(st.mu);
    st.buffer.emplace_back(seq, std::move(shared));
    while (st.buffer.size() > st.options.replay_buffer)
      st.buffer.pop_front();
  }
  if (!sent) {
    return Status::IoError(fmt::format("kv events: sending batch {} on {} failed: {}", seq,
                                       st.endpoint, zmq_strerror(zmq_errno())));
  }
  return Status::Ok();
}

void KvEventPublisher::State::ServeReplay() {
  std::vector<std::vector<unsigned char>> parts;
  std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<unsigned char>>>> batches;
  while (!stop) {
    zmq_pollitem_t item{replay, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 50) <= 0) continue;
    // [identity, (empty delimiter from a REQ peer,) 8-byte start sequence]: at most three parts
    // are kept; the rest of a longer message is drained and the request refused.
    parts.clear();
    bool too_many = false;
    int more = 1;
    while (more != 0) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, replay, 0) < 0) {
        zmq_msg_close(&m);
        break;
      }
      if (parts.size() < 3) {
        const auto* d = static_cast<const unsigned char*>(zmq_msg_data(&m));
        parts.emplace_back(d, d + zmq_msg_size(&m));
      } else {
        too_many = true;
      }
      size_t len = sizeof(more);
      zmq_getsockopt(replay, ZMQ_RCVMORE, &more, &len);
      zmq_msg_close(&m);
    }
    if (too_many || parts.size() < 2 || parts.back().size() != 8) {
      ++replays_refused;
      continue;  // not a replay request
    }
    const int64_t from = FromBigEndian(parts.back().data());
    const std::vector<unsigned char>& id = parts.front();
    batches.clear();
    {
      std::lock_guard lock(mu);
      // Sequences in the buffer are consecutive: start at `from` without a scan.
      const int64_t first = buffer.empty() ? 0 : buffer.front().first;
      const int64_t skip =
          std::clamp<int64_t>(from - first, 0, static_cast<int64_t>(buffer.size()));
      batches.assign(buffer.begin() + skip, buffer.end());
    }
    unsigned char seq_bytes[8];
    for (const auto& [seq, payload] : batches) {
      BigEndian(seq, seq_bytes);
      SendParts(
          replay,
          {{id.data(), id.size()}, {"", 0}, {seq_bytes, 8}, {payload->data(), payload->size()}});
    }
    BigEndian(-1, seq_bytes);
    SendParts(replay, {{id.data(), id.size()}, {"", 0}, {seq_bytes, 8}, {"", 0}});
  }
}

}  // namespace hkv
