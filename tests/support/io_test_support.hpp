// Helpers shared by the I/O tests: scratch paths on the disk (/tmp, ext4 here: O_DIRECT
// works) and on tmpfs (/dev/shm), deterministic byte patterns, checksums, guarded
// buffers, and the engine list the tier tests are templated over.
#pragma once

#include <ferry/io/auto_engine.hpp>
#include <ferry/io/syscalls.hpp>
#include <ferry/io/thread_pool_engine.hpp>
#include <ferry/io/uring.hpp>
#include <ferry/tier/nvme.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace ferry_test {

/// A unique path in `dir`, with no file there (removed when the object dies).
class scratch_path {
 public:
  explicit scratch_path(const std::string& dir, const std::string& stem = "ferry-io-test") {
    static std::atomic<unsigned> counter{0};
    path_ = std::filesystem::path(dir) /
            (stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + ".bin");
    // A file already there is a dead process's (the name holds this live process's pid):
    // one killed mid-test, or a forked child that exited without destructors. Left, it
    // would make a test that expects to create the file find one (the fault matrix's
    // "removes the file it created" failed so once the pid came round again).
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  scratch_path(const scratch_path&) = delete;
  scratch_path& operator=(const scratch_path&) = delete;
  ~scratch_path() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline const std::string disk_dir = "/tmp";       // ext4 on this machine: O_DIRECT works
inline const std::string tmpfs_dir = "/dev/shm";  // tmpfs

/// Byte `i` of pattern `seed`: changes every byte, differs between seeds.
inline std::byte pattern_byte(std::uint64_t seed, std::size_t i) noexcept {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xFF);
}

inline void fill(std::span<std::byte> out, std::uint64_t seed) noexcept {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = pattern_byte(seed, i);
}

/// `n` bytes of pattern `seed`.
inline std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  fill(v, seed);
  return v;
}

/// Holds a stream item (or the test) until opened: makes "not yet" deterministic
/// without sleeps.
class gate {
 public:
  void open() {
    {
      std::lock_guard lock(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

/// FNV-1a, 64 bit.
inline std::uint64_t checksum(std::span<const std::byte> in) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : in) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

/// `bytes` bytes at `misalign` bytes past a 4096-aligned address, with 64 guard bytes
/// (0xA5) before and after, so a transfer that touches memory outside is caught.
class guarded_buffer {
 public:
  static constexpr std::size_t guard = 64;
  static constexpr std::byte guard_byte{0xA5};

  explicit guarded_buffer(std::size_t bytes, std::size_t misalign = 0)
      : bytes_(bytes), misalign_(misalign), total_(4096 + misalign + bytes + guard) {
    base_ = static_cast<std::byte*>(::operator new(total_, std::align_val_t{4096}));
    std::memset(base_, static_cast<int>(guard_byte), total_);
  }
  guarded_buffer(const guarded_buffer&) = delete;
  guarded_buffer& operator=(const guarded_buffer&) = delete;
  ~guarded_buffer() { ::operator delete(base_, std::align_val_t{4096}); }

  [[nodiscard]] std::span<std::byte> span() const noexcept { return {base_ + 4096 + misalign_, bytes_}; }
  [[nodiscard]] bool guards_intact() const noexcept {
    const std::byte* data = base_ + 4096 + misalign_;
    for (const std::byte* p = data - guard; p < data; ++p)
      if (*p != guard_byte) return false;
    for (const std::byte* p = data + bytes_; p < data + bytes_ + guard; ++p)
      if (*p != guard_byte) return false;
    return true;
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t bytes_;
  std::size_t misalign_;
  std::size_t total_;
};

/// Whether the file system of `dir` accepts an O_DIRECT open right now.
inline bool accepts_o_direct(const std::string& dir) {
  scratch_path p(dir, "probe");
  const int fd = ::open(p.str().c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// --- the engines the tier tests run on ------------------------------------------------

struct pool_engine {
  template <class S>
  using tier = ferry::basic_nvme_tier<S, ferry::io::thread_pool_engine>;
  template <class S>
  using engine = ferry::io::thread_pool_engine<S>;
  static constexpr bool is_uring = false;
};

#if FERRY_HAS_URING
struct uring_engine {
  template <class S>
  using tier = ferry::basic_nvme_tier<S, ferry::io::uring_engine>;
  template <class S>
  using engine = ferry::io::uring_engine<S>;
  static constexpr bool is_uring = true;
};
// io::auto_engine, the default engine: io_uring here, or the pool where io_uring is refused.
struct auto_engine {
  template <class S>
  using tier = ferry::basic_nvme_tier<S, ferry::io::auto_engine>;
  template <class S>
  using engine = ferry::io::auto_engine<S>;
  static constexpr bool is_uring = true;
};
#define FERRY_TEST_ENGINES ferry_test::pool_engine, ferry_test::uring_engine
#define FERRY_TEST_ALL_ENGINES ferry_test::pool_engine, ferry_test::uring_engine, ferry_test::auto_engine
#else
#define FERRY_TEST_ENGINES ferry_test::pool_engine
#define FERRY_TEST_ALL_ENGINES ferry_test::pool_engine
#endif

/// Options for a small test tier on `path`.
/// Writes `text` to `path` (created or emptied): a user's own file in the tests.
inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.good()) throw std::runtime_error("write_text: cannot write " + path.string());
}

/// The whole content of `path`.
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline ferry::nvme_options small_options(std::vector<std::filesystem::path> paths, std::uint64_t capacity) {
  ferry::nvme_options o;
  o.paths = std::move(paths);
  o.capacity = capacity;
  o.queue_depth = 4;
  o.block_bytes = 256 * 1024;
  o.threads = 3;
  o.staging_blocks = 2;
  return o;
}

}  // namespace ferry_test
