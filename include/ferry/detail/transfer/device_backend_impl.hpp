/// @file
/// @brief The bodies of `ferry::device_backend`'s completion threads (one per stream, in
/// record order), its event pool and its pages of host-signalled flags. Internal to
/// `ferry::device_backend` (transfer/device_backend.hpp, which includes it).
#pragma once

#include "ferry/transfer/device_backend_decl.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>

namespace ferry {

template <device_runtime Api>
auto device_backend<Api>::acquire_event() -> event_handle {
  {
    std::lock_guard lock(events_mutex_);
    if (!free_events_.empty()) {
      event_handle e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  event_handle e{};
  FERRY_RUNTIME_TRY(Api, api_.event_create(&e));
  std::lock_guard lock(events_mutex_);
  all_events_.push_back(e);
  free_events_.reserve(all_events_.size());  // so that release never allocates
  return e;
}

template <device_runtime Api>
auto device_backend<Api>::complete(queue& q) noexcept -> void {
  (void)api_.set_device(device_);
  // ferry's own thread: its event queries must not invalidate a global-mode graph
  // capture the user has in progress on another thread (they would under CUDA's default
  // mode: cudaErrorStreamCaptureUnsupported here, cudaErrorStreamCaptureInvalidated at
  // the user's end of capture; gpu-runs 2026-12-04, G2b).
  (void)api_.relax_capture_mode();
  std::unique_lock lock(q.mutex);
  auto backoff = std::chrono::microseconds(10);
  for (;;) {
    q.cv.wait(lock, [&] { return q.stopping || !q.items.empty(); });
    if (q.items.empty()) return;
    const item it = q.items.front();
    status_type status{};
    if (q.lane) {
      // A lane's queue may gain an earlier record at its front (`then` on an older
      // copy) while the front waits: poll the front, woken at once by every push,
      // instead of blocking on it (10 us, doubling to 500 us, between queries).
      lock.unlock();
      status = api_.event_query(it.marker.event);
      lock.lock();
      const item& now = q.items.front();
      const bool same = now.marker.seq == it.marker.seq && now.marker.event == it.marker.event &&
                        now.context == it.context && now.fn == it.fn;
      if (Api::not_ready(status) || !same) {
        if (same) {
          q.cv.wait_for(lock, backoff);
          backoff = std::min(backoff * 2, std::chrono::microseconds(500));
        }
        continue;
      }
      backoff = std::chrono::microseconds(10);
    }
    q.items.pop_front();
    q.busy = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      // A query that failed says nothing about whether the copy has landed (a capture
      // rule, a lost context): only the event's own completion, or its error, ends it.
      if (!q.lane || !Api::ok(status)) status = api_.event_synchronize(it.marker.event);
      FERRY_RUNTIME_TRY(Api, status);
    } catch (...) {
      error = std::current_exception();
    }
    if (it.owned) {
      marker_type m = it.marker;
      release(m);
    }
    {
      const detail::continuation_mark mark;
      it.fn(it.context, std::move(error));
    }
    lock.lock();
    q.busy = false;
    if (q.items.empty()) q.idle_cv.notify_all();
  }
}

template <device_runtime Api>
auto device_backend<Api>::grow_flags() -> void {
  FERRY_EXPECTS(page_count_ < max_flag_pages,
                "more disk moves with live tickets at once than the scheduler has flags for; drop tickets of "
                "finished moves",
                page_count_ * flags_per_page);
  void* page = nullptr;
  FERRY_RUNTIME_TRY(Api, api_.host_alloc_mapped(&page, flags_per_page * sizeof(std::uint32_t)));
  void* device = nullptr;
  const status_type status = api_.device_pointer(&device, page);
  if (!Api::ok(status)) {
    (void)api_.free_host(page);
    FERRY_RUNTIME_TRY(Api, status);
  }
  std::memset(page, 0, flags_per_page * sizeof(std::uint32_t));
  // A fixed array: `raise` and `wait_signal` read it without the lock, for slots handed
  // out after their page was stored here (a growing vector would move under them).
  pages_[page_count_] = {static_cast<std::uint32_t*>(page), static_cast<std::byte*>(device)};
  ++page_count_;
  targets_.resize(page_count_ * flags_per_page, 0);
  free_flags_.reserve(targets_.size());
  for (std::size_t i = 0; i < flags_per_page; ++i) {
    free_flags_.push_back(static_cast<std::uint32_t>(targets_.size() - 1 - i));
  }
}

template <device_runtime Api>
auto device_backend<Api>::release_all() noexcept -> void {
  shutdown();
  for (stream_handle& s : streams_) {
    if (s != stream_handle{}) FERRY_RUNTIME_ASSERT(Api, api_.stream_destroy(s));
    s = stream_handle{};
  }
  for (stream_handle s : extra_streams_) FERRY_RUNTIME_ASSERT(Api, api_.stream_destroy(s));
  extra_streams_.clear();
  extra_queues_.clear();
  for (auto& q : lane_queues_) q.reset();
  for (auto& f : free_streams_) f.clear();
  for (event_handle e : all_events_) FERRY_RUNTIME_ASSERT(Api, api_.event_destroy(e));
  all_events_.clear();
  free_events_.clear();
  // A stream told to wait on a flag (`cuStreamWaitValue32`) may not have got to that
  // wait yet, and the backend cannot know when it will: once such waits were issued,
  // the flag pages (4 KiB each) are left allocated rather than freed under them.
  if (!waits_issued_.load(std::memory_order_relaxed)) {
    for (std::size_t i = 0; i < page_count_; ++i) FERRY_RUNTIME_ASSERT(Api, api_.free_host(pages_[i].host));
  }
  page_count_ = 0;
}

}  // namespace ferry
