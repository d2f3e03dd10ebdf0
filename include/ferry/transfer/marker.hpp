/// @file
/// @brief `ferry::basic_marker`: an owning handle of a backend marker (an event recorded
/// on a stream), the one RAII type the scheduler and the pipelines hold markers in.
#pragma once

#include <utility>

namespace ferry {

/// @brief Owns one marker of `Backend` (`device_backend<Runtime>`: a pooled event
/// recorded on a stream) and gives it back to the backend's event pool when destroyed or
/// reset. Empty when default-constructed, moved from or released. Move-only; shared
/// between owners as `std::shared_ptr<basic_marker>` (a KV block's producer, read by
/// every sequence that shares the block).
///
/// Lifetime: the backend must outlive the marker. Giving the event back while its record
/// is still pending is allowed: the pool reuses it only for a new record, which CUDA
/// allows.
/// @tparam Backend a backend with `marker_type`, `record(stream)` and `release(marker&)`
template <class Backend>
class basic_marker {
 public:
  using backend_type = Backend;                       ///< the backend
  using marker_type = typename Backend::marker_type;  ///< the backend's marker
  using stream_type = typename Backend::stream_type;  ///< the backend's stream

  /// @brief An empty handle.
  basic_marker() noexcept = default;
  /// @brief Takes ownership of `m`, a marker of `b`.
  basic_marker(Backend& b, marker_type m) noexcept : backend_(&b), m_(m) {}
  /// @brief Records a marker on `s`: the end of the work enqueued there so far.
  /// @throws the backend's `record` errors (the legacy default stream, a stream of
  ///         another device, ferry::device_error); nothing is owned then
  [[nodiscard]] static basic_marker record(Backend& b, stream_type s) { return basic_marker(b, b.record(s)); }

  /// @brief Takes `o`'s marker; `o` is empty afterwards.
  basic_marker(basic_marker&& o) noexcept : backend_(std::exchange(o.backend_, nullptr)), m_(o.m_) {}
  /// @brief Gives this handle's marker back, then takes `o`'s; `o` is empty afterwards.
  basic_marker& operator=(basic_marker&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = std::exchange(o.backend_, nullptr);
      m_ = o.m_;
    }
    return *this;
  }
  basic_marker(const basic_marker&) = delete;
  basic_marker& operator=(const basic_marker&) = delete;
  /// @brief Gives the marker back (`reset`). Never throws.
  ~basic_marker() { reset(); }

  /// @brief Whether a marker is owned.
  [[nodiscard]] explicit operator bool() const noexcept { return backend_ != nullptr; }
  /// @brief The marker (for `wait`, `query`, `synchronize` of the backend). Owned: check first.
  [[nodiscard]] const marker_type& get() const noexcept { return m_; }
  /// @brief The backend it belongs to (null when empty).
  [[nodiscard]] Backend* backend() const noexcept { return backend_; }

  /// @brief Gives the marker back to the backend's pool; empty afterwards. Never throws.
  void reset() noexcept {
    if (backend_ != nullptr) std::exchange(backend_, nullptr)->release(m_);
  }
  /// @brief Hands the marker to the caller, who must release it; empty afterwards.
  [[nodiscard]] marker_type release() noexcept {
    backend_ = nullptr;
    return m_;
  }

 private:
  Backend* backend_ = nullptr;
  marker_type m_{};
};

}  // namespace ferry
