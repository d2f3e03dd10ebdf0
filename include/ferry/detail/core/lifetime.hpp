/// @file
/// @brief Detection of a broken destruction order: a resource (a tier, a pool) that is
/// destroyed while an object that borrowed it (a cache) still lives stops the process
/// with one line naming both, instead of leaving the borrower to crash later in its own
/// destructor (a use after free that may also seem to work for a while).
///
/// The resource holds a `lifetime_anchor`; each borrower holds a `lifetime_link` to it
/// for as long as it keeps a pointer to the resource. The resource's destructor calls
/// `lifetime_anchor::expect_no_users` first: with a link still alive it writes
/// "ferry: nvme_tier 0x... (/mnt/nvme/ferry.bin) destroyed while 1 object still uses it:
/// tensor_cache 0x...; destroy them before it" to stderr and calls `std::abort`. There is
/// no way to make that order safe (the borrower's moves and extents are in the resource),
/// and a destructor cannot throw.
#pragma once

#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ferry::detail {

/// The resource's side: the borrowers alive now. Not copyable or movable (borrowers
/// point at it); thread-safe.
class lifetime_anchor {
 public:
  lifetime_anchor() = default;
  lifetime_anchor(const lifetime_anchor&) = delete;
  lifetime_anchor& operator=(const lifetime_anchor&) = delete;

  /// How many borrowers are alive.
  [[nodiscard]] std::size_t users() const {
    std::lock_guard lock(mutex_);
    return users_.size();
  }

  /// Called first thing in the resource's destructor: with borrowers alive, writes one
  /// line naming the resource (`kind` at `self`, `detail` if not empty) and each
  /// borrower to stderr, then aborts.
  void expect_no_users(const char* kind, const void* self, const std::string& detail = {}) const noexcept {
    std::lock_guard lock(mutex_);
    if (users_.empty()) return;
    std::string line;
    try {
      line = std::string("ferry: ") + kind + ' ' + address(self) + (detail.empty() ? "" : " (" + detail + ")") +
             " destroyed while " + std::to_string(users_.size()) + (users_.size() == 1 ? " object" : " objects") +
             " still use" + (users_.size() == 1 ? "s" : "") + " it:";
      const char* sep = " ";
      for (const auto& u : users_) {
        line += sep;
        line += u.kind;
        line += ' ';
        line += address(u.user);
        sep = ", ";
      }
      line += "; destroy them before it (a lifetime error in the caller)";
      std::fprintf(stderr, "%s\n", line.c_str());
    } catch (...) {
      std::fprintf(stderr, "ferry: %s %p destroyed while objects still use it; destroy them before it\n", kind, self);
    }
    std::fflush(stderr);
    std::abort();
  }

 private:
  friend class lifetime_link;
  struct user {
    const void* user;
    const char* kind;
  };

  static std::string address(const void* p) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%p", p);
    return buffer;
  }

  void attach(const void* who, const char* kind) {
    std::lock_guard lock(mutex_);
    users_.push_back({who, kind});
  }
  void detach(const void* who) noexcept {
    std::lock_guard lock(mutex_);
    for (auto it = users_.begin(); it != users_.end(); ++it) {
      if (it->user == who) {
        users_.erase(it);
        return;
      }
    }
  }

  mutable std::mutex mutex_;
  std::vector<user> users_;
};

/// The borrower's side: registered with the anchor from construction to destruction.
/// Not copyable or movable (it names its borrower's address).
class lifetime_link {
 public:
  lifetime_link() = default;
  /// Registers `who` (a `kind`, e.g. "tensor_cache") as a borrower of `anchor`'s resource
  /// (none when `anchor` is null). `kind` must be a string literal.
  /// @throws std::bad_alloc
  lifetime_link(lifetime_anchor* anchor, const void* who, const char* kind) : anchor_(anchor), who_(who) {
    if (anchor_ != nullptr) anchor_->attach(who_, kind);
  }
  lifetime_link(const lifetime_link&) = delete;
  lifetime_link& operator=(const lifetime_link&) = delete;
  ~lifetime_link() {
    if (anchor_ != nullptr) anchor_->detach(who_);
  }

 private:
  lifetime_anchor* anchor_ = nullptr;
  const void* who_ = nullptr;
};

/// The anchor of `resource` where its type has one (`lifetime_anchor()`: ferry's tiers
/// and pools), else null (a user's own tier: no check).
template <class T>
lifetime_anchor* anchor_of(T* resource) noexcept {
  if constexpr (requires(T& t) {
                  { t.lifetime_anchor() } -> std::same_as<lifetime_anchor&>;
                }) {
    return resource != nullptr ? &resource->lifetime_anchor() : nullptr;
  } else {
    return nullptr;
  }
}

}  // namespace ferry::detail
