// Work split over XLA:CPU's intra-op threads, for the FFI handlers of this folder.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace tj {

// Calls fn(i) for every i in [0, n), at most `tasks` at a time: the calling thread and
// tasks - 1 tasks it schedules on `pool` claim indices from a counter, so the caller never
// waits for an index that no thread has started (no deadlock when every pool thread is
// inside a handler), and returns once all are done. fn must be safe to call concurrently.
template <typename Fn>
void ParallelFor(xla::ffi::ThreadPool pool, int64_t n, int64_t tasks, Fn fn) {
  tasks = std::min<int64_t>(n, tasks);
  if (tasks <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto state = std::make_shared<State>();
  auto work = [state, fn, n] {
    for (int64_t i; (i = state->next.fetch_add(1)) < n;) {
      fn(i);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < tasks; ++t) pool.Schedule([work] { work(); });
  work();
  while (state->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

}  // namespace tj
