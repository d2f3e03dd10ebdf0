/// @file
/// @brief Pieces of `ferry::kv_cache`'s body (detail/pipeline/kv_cache_engine.hpp): a
/// backend marker shared by the blocks it orders. Not part of the public interface.
#pragma once

namespace ferry::detail {

// A backend marker shared by the blocks it orders (released with the last of them).
template <class Backend>
struct shared_marker {
  Backend* backend;
  typename Backend::marker_type marker;
  shared_marker(Backend& b, typename Backend::marker_type m) : backend(&b), marker(m) {}
  shared_marker(const shared_marker&) = delete;
  shared_marker& operator=(const shared_marker&) = delete;
  ~shared_marker() { backend->release(marker); }
};

}  // namespace ferry::detail
