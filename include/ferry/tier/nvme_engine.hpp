/// @file
/// @brief `ferry::io::default_engine`: the I/O engine an `nvme_tier` runs by default.
#pragma once

#include "ferry/io/auto_engine.hpp"
#include "ferry/io/thread_pool_engine.hpp"
#include "ferry/io/uring.hpp"

namespace ferry {

namespace io {
/// @brief The engine `ferry::nvme_tier` uses: when ferry is built with liburing
/// (`FERRY_HAS_URING`), `io::auto_engine` (io_uring, or the pread/pwrite thread pool
/// where the kernel refuses io_uring); otherwise the thread pool.
#if FERRY_HAS_URING
template <class S>
using default_engine = auto_engine<S>;
#else
template <class S>
using default_engine = thread_pool_engine<S>;
#endif
}  // namespace io

}  // namespace ferry
