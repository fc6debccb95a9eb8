// The Python-side handle of a KvCacheManager: the manager and the lock that serialises Python
// threads on it.
//
// Contract: Locked/LockedConst run a function on the manager with the GIL released and the lock
// held (for calls that touch no Python object); Hold takes the lock and keeps the GIL (for calls
// that build Python objects from the manager's memory). The lock is never awaited while holding
// the GIL, and the GIL is never awaited while the lock is held by a GIL-free call, so the two
// cannot deadlock.
#pragma once

#include <mutex>
#include <utility>

#include <pybind11/pybind11.h>

#include <hkv/manager/kv_cache_manager.h>

namespace hkv::python {

class Manager {
 public:
  explicit Manager(KvCacheManager m) : m_(std::move(m)) {}

  // Runs f on the manager without the GIL, under the lock.
  template <typename F>
  auto Locked(F&& f) {
    pybind11::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return f(m_);
  }
  template <typename F>
  auto LockedConst(F&& f) const {
    pybind11::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return f(m_);
  }
  // Without releasing the GIL: for calls that build Python objects from manager data.
  std::unique_lock<std::mutex> Hold() const {
    pybind11::gil_scoped_release release;  // never wait for the lock while holding the GIL
    return std::unique_lock<std::mutex>(mu_);
  }
  const KvCacheManager& raw() const { return m_; }
  KvCacheManager& raw() { return m_; }

 private:
  mutable std::mutex mu_;
  KvCacheManager m_;
};

}  // namespace hkv::python
