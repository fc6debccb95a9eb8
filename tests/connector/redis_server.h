// A real redis-server (Debian's) on loopback for tests and benchmarks: started on a free TCP port
// of 127.0.0.1 with persistence off, in a directory of its own; killed with the object.
//
// Contract: Start finds a free port (binding port 0 and reading it back), spawns the server and
// waits until it answers PING (5 s at most); a port taken meanwhile by another process is retried
// with a new one. Kill sends SIGKILL and reaps the process (a crash, not a shutdown); Restart
// starts a new server on the same port. A missing redis-server is an error naming the package.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hkv/common/result.h>
#include <hkv/connector/remote_tier.h>

#include "test_model.h"

extern char** environ;

namespace hkv::testing {

class RedisServer {
 public:
  RedisServer() = default;
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer() {
    Kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // Before Start: more server arguments (e.g. {"--requirepass", "pw"}), and the credentials the
  // probe and Options() then use.
  void AddArgs(std::vector<std::string> args) {
    extra_args_.insert(extra_args_.end(), args.begin(), args.end());
  }
  void SetCredentials(std::string username, std::string password) {
    username_ = std::move(username);
    password_ = std::move(password);
  }
  // Before Start: also listen on this Unix socket.
  void SetUnixSocket(std::filesystem::path path) { unix_socket_ = std::move(path); }
  const std::filesystem::path& unix_socket() const { return unix_socket_; }

  Status Start() {
    for (int attempt = 0; attempt < 5; ++attempt) {
      const int port = FreePort();
      if (port <= 0) return Status::IoError("redis fixture: no free loopback port");
      port_ = port;
      if (Spawn().ok() && WaitReady()) return Status::Ok();
      Kill();
    }
    return Status::IoError(
        "redis fixture: redis-server did not start on loopback (is Debian's redis-server "
        "installed? scripts/setup.sh installs it)");
  }
  Status Restart() {
    Kill();
    HKV_RETURN_IF_ERROR(Spawn());
    if (!WaitReady()) return Status::IoError("redis fixture: restart did not answer");
    return Status::Ok();
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  int port() const { return port_; }
  RemoteTierOptions Options(std::string name_space, int64_t capacity = int64_t{1} << 30) const {
    RemoteTierOptions o;
    o.port = port_;
    o.name_space = std::move(name_space);
    o.model = TestModel();
    o.username = username_;
    o.password = password_;
    o.capacity_bytes = capacity;
    o.timeout_ms = 1000;
    o.retry_after_ms = 50;
    return o;
  }

 private:
  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    ::close(fd);
    return port;
  }

  Status Spawn() {
    if (dir_.empty()) {
      dir_ = std::filesystem::temp_directory_path() /
             ("hkv-redis-" + std::to_string(::getpid()) + "-" + std::to_string(port_));
      std::filesystem::create_directories(dir_);
    }
    const std::string port = std::to_string(port_);
    const std::string dir = dir_.string();
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     port,
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir,
                                     "--loglevel",
                                     "warning",
                                     "--daemonize",
                                     "no",
                                     "--protected-mode",
                                     "no"};
    if (!unix_socket_.empty()) {
      args.push_back("--unixsocket");
      args.push_back(unix_socket_.string());
    }
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    for (std::string& s : args)
      argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawnp(&pid_, "redis-server", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = -1;
      return Status::IoError("redis fixture: cannot spawn redis-server");
    }
    return Status::Ok();
  }

  bool WaitReady() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    RemoteTierOptions o = Options("probe");
    o.timeout_ms = 200;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: port taken, most likely
        pid_ = -1;
        return false;
      }
      if (RemoteTier::Connect(o).ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::filesystem::path dir_;
  std::vector<std::string> extra_args_;
  std::string username_, password_;
  std::filesystem::path unix_socket_;
};

// One server for a whole test binary, started on first use and killed at exit; tests keep apart
// by namespace (FreshNamespace).
inline RedisServer& SharedRedisServer() {
  static RedisServer* server = [] {
    auto* s = new RedisServer();
    const Status started = s->Start();
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.ToString().c_str());
      std::abort();
    }
    std::atexit([] { SharedRedisServer().Kill(); });
    return s;
  }();
  return *server;
}

inline std::string FreshNamespace(const char* prefix) {
  static int counter = 0;
  return std::string(prefix) + "-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
}

}  // namespace hkv::testing
