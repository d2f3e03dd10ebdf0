// The I/O engines on raw requests: batches, submission from completion callbacks,
// the syscalls hook, (io_uring) registered buffers and SQPOLL, and the default engine's
// fallback to the thread pool where io_uring is refused.
#include <ferry/io/direct_file.hpp>
#include <ferry/io/request.hpp>
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "io_test_support.hpp"

using ferry::io::compat_mode;
using ferry::io::direct_file;
using ferry::io::io_request;
using ferry::io::op_kind;
using ferry::io::posix_syscalls;
using ferry_test::scratch_path;

namespace {

// Counts completions. The callback updates and notifies under the mutex, so once
// wait_for() returns no callback touches the counter any more.
struct counter {
  std::mutex m;
  std::condition_variable cv;
  std::uint32_t done = 0;
  std::int64_t bytes = 0;
  std::int64_t worst = 0;

  static void on_complete(void* context, io_request&, std::int64_t result) noexcept {
    static_cast<counter*>(context)->add(result);
  }
  void add(std::int64_t result) noexcept {
    std::lock_guard lock(m);
    if (result < 0) {
      worst = result;
    } else {
      bytes += result;
    }
    ++done;
    cv.notify_all();
  }
  void wait_for(std::uint32_t n) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return done >= n; });
  }
  std::int64_t worst_result() {
    std::lock_guard lock(m);
    return worst;
  }
  std::int64_t total_bytes() {
    std::lock_guard lock(m);
    return bytes;
  }
};

template <class Engine>
void run_batches(Engine& engine, std::span<std::byte> memory, std::size_t block, std::uint64_t seed) {
  const std::size_t n = memory.size() / block;
  ferry_test::fill(memory, seed);
  const std::uint64_t sum = ferry_test::checksum(memory);
  std::vector<io_request> requests(n);
  std::vector<io_request*> pointers;
  counter c;
  for (std::size_t i = 0; i < n; ++i) {
    requests[i] = {op_kind::write, 0, i * block, memory.data() + i * block, block, &counter::on_complete, &c};
    pointers.push_back(&requests[i]);
  }
  engine.submit(pointers);  // one batch
  c.wait_for(static_cast<std::uint32_t>(n));
  REQUIRE(c.worst_result() == 0);
  CHECK(c.total_bytes() == static_cast<std::int64_t>(memory.size()));
  std::fill(memory.begin(), memory.end(), std::byte{0});
  counter r;
  for (std::size_t i = 0; i < n; ++i) {
    requests[i].kind = op_kind::read;
    requests[i].context = &r;
    engine.submit(std::span<io_request* const>(&pointers[i], 1));  // one at a time
  }
  r.wait_for(static_cast<std::uint32_t>(n));
  REQUIRE(r.worst_result() == 0);
  CHECK(ferry_test::checksum(memory) == sum);
}

}  // namespace

TEMPLATE_TEST_CASE("engines run batches of requests and complete each once", "[io][engine]", FERRY_TEST_ENGINES) {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 4;  // fewer than the requests: the rest wait in the engine's queue
  o.threads = 2;
  typename TestType::template engine<posix_syscalls> engine(sys, std::span<const int>(&fd, 1), o);
  ferry::io::aligned_buffer memory(64 * 4096, 4096);
  run_batches(engine, memory.span(), 4096, 1);
  const auto s = engine.stats();
  CHECK(s.submitted == 128);
  CHECK(s.completed == 128);
}

TEMPLATE_TEST_CASE("engines accept submissions from completion callbacks", "[io][engine]", FERRY_TEST_ENGINES) {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  using engine_t = typename TestType::template engine<posix_syscalls>;
  struct link {
    engine_t* engine;
    std::vector<io_request>* all;
    std::size_t index;
    counter* c;
  };
  // Declared before the engine, so they outlive it (its destructor waits for callbacks).
  ferry::io::aligned_buffer memory(32 * 4096, 4096);
  ferry_test::fill(memory.span(), 9);
  std::vector<io_request> requests(32);
  std::vector<link> links(32);
  counter c;
  ferry::io::engine_options o;
  o.queue_depth = 2;
  o.threads = 2;
  engine_t engine(sys, std::span<const int>(&fd, 1), o);
  for (std::size_t i = 0; i < 32; ++i) {
    links[i] = {&engine, &requests, i, &c};
    requests[i] = {op_kind::write,
                   0,
                   i * 4096,
                   memory.data() + i * 4096,
                   4096,
                   [](void* context, io_request&, std::int64_t result) noexcept {
                     auto* l = static_cast<link*>(context);
                     if (l->index + 1 < l->all->size()) {
                       io_request* next = &(*l->all)[l->index + 1];
                       l->engine->submit(std::span<io_request* const>(&next, 1));
                     }
                     l->c->add(result == 4096 ? 0 : (result < 0 ? result : -1));
                   },
                   &links[i]};
  }
  io_request* first = &requests[0];
  engine.submit(std::span<io_request* const>(&first, 1));
  c.wait_for(32);
  CHECK(c.worst_result() == 0);
  std::vector<std::byte> back(32 * 4096);
  direct_file plain(sys, path.str(), {.mode = compat_mode::buffered, .create = false});
  plain.read(0, back);
  CHECK(ferry_test::checksum(back) == ferry_test::checksum(memory.span()));
}

#if FERRY_HAS_URING
TEST_CASE("uring_engine uses registered files and buffers", "[io][uring]") {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 8;
  o.buffer_slots = 4;
  ferry::io::uring_engine<> engine(sys, std::span<const int>(&fd, 1), o);
  CHECK(engine.fixed_files());
  REQUIRE(engine.buffer_table());       // Linux 5.19+; this machine runs 6.x
  CHECK_FALSE(engine.fixed_buffers());  // a table, but nothing in it: requests are not fixed
  CHECK(engine.registered_bytes() == 0);
  CHECK(engine.queue_depth() == 8);
  ferry::io::aligned_buffer memory(16 * 4096, 4096);

  run_batches(engine, memory.span(), 4096, 2);
  CHECK(engine.stats().fixed_buffer == 0);  // nothing registered yet
  CHECK(engine.stats().submit_calls >= 1);

  REQUIRE(engine.register_buffer(memory.span()));
  CHECK(engine.fixed_buffers());
  CHECK(engine.registered_bytes() == 16 * 4096);
  run_batches(engine, memory.span(), 4096, 3);
  CHECK(engine.stats().fixed_buffer == 32);  // every request inside the registered range

  engine.unregister_buffer(memory.span());
  CHECK_FALSE(engine.fixed_buffers());
  CHECK(engine.registered_bytes() == 0);
  run_batches(engine, memory.span(), 4096, 4);
  CHECK(engine.stats().fixed_buffer == 32);
  CHECK(engine.buffer_refusals() == 0);
  CHECK(engine.buffer_refusal_reason().empty());

  // The table has 4 slots: a fifth registration is refused, and I/O still works.
  std::vector<ferry::io::aligned_buffer> more;
  for (int i = 0; i < 4; ++i) {
    more.emplace_back(4096, 4096);
    CHECK(engine.register_buffer(more.back().span()));
  }
  CHECK_FALSE(engine.register_buffer(memory.span()));
  CHECK(engine.buffer_refusals() == 1);
  CHECK(engine.buffer_refusal_reason() == "the table's 4 slots are full");
  CHECK(engine.registered_bytes() == 4 * 4096);
  run_batches(engine, memory.span(), 4096, 5);
  for (auto& m : more) engine.unregister_buffer(m.span());
  CHECK_FALSE(engine.fixed_buffers());
}

TEST_CASE(
    "uring_engine: registrations the kernel refuses (RLIMIT_MEMLOCK's ENOMEM) leave fixed_buffers() false, "
    "say why, and I/O works",
    "[io][uring][faults]") {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  // What the kernel answers an unprivileged process past RLIMIT_MEMLOCK (64 KiB by default).
  const std::size_t rule = plan->add(
      {.call = ferry::io::syscall_kind::uring_register_buffer, .error = ENOMEM, .times = ferry::io::fault::forever});
  ferry::io::faulty_syscalls<> sys(plan);
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 8;
  o.buffer_slots = 4;
  ferry::io::uring_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), o);
  REQUIRE(engine.buffer_table());
  ferry::io::aligned_buffer memory(16 * 4096, 4096);
  CHECK_FALSE(engine.register_buffer(memory.span()));
  CHECK(plan->fired(rule) == 1);
  CHECK_FALSE(engine.fixed_buffers());
  CHECK(engine.registered_bytes() == 0);
  CHECK(engine.buffer_refusals() == 1);
  CHECK(engine.buffer_refusal_reason() ==
        "io_uring_register_buffers_update: " + std::generic_category().message(ENOMEM) + " (ENOMEM)");
  run_batches(engine, memory.span(), 4096, 6);
  CHECK(engine.stats().fixed_buffer == 0);  // every request took the page-pinning path

  // The same through a tier: its staging blocks stay unregistered, and it says so.
  plan->clear();
  plan->add(
      {.call = ferry::io::syscall_kind::uring_register_buffer, .error = ENOMEM, .times = ferry::io::fault::forever});
  scratch_path tier_path(ferry_test::disk_dir);
  ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>, ferry::io::uring_engine> tier(
      ferry_test::small_options({tier_path.path()}, 8 * ferry::MiB), ferry::io::faulty_syscalls<>(plan));
  CHECK_FALSE(tier.staging_registered());
  CHECK_FALSE(tier.engine().fixed_buffers());
  CHECK(tier.engine().buffer_table());
  CHECK(tier.engine().buffer_refusal_reason().find("ENOMEM") != std::string::npos);
  auto r = tier.allocate(1 * ferry::MiB + 100);  // a tail: through a staging block
  std::vector<std::byte> out(1 * ferry::MiB + 100), back(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i * 13 + 5);
  tier.write(r, out);
  tier.read(r, back);
  CHECK(ferry_test::checksum(back) == ferry_test::checksum(out));
  tier.deallocate(r);
}

TEST_CASE("uring_engine with submissions coalesced over a whole batch of completions", "[io][uring]") {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 4;
  o.submit_batch = 1000;
  ferry::io::uring_engine<> engine(sys, std::span<const int>(&fd, 1), o);
  CHECK(engine.submit_batch() == 1000);
  CHECK(engine.defer_taskrun());  // Linux 6.1+ (this machine runs 6.x)
  ferry::io::aligned_buffer memory(32 * 4096, 4096);
  run_batches(engine, memory.span(), 4096, 7);
  CHECK(engine.stats().completed == 64);
}

TEST_CASE("uring_engine with SQPOLL", "[io][uring]") {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 8;
  o.sqpoll = true;
  o.sqpoll_idle_ms = 10;
  ferry::io::uring_engine<> engine(sys, std::span<const int>(&fd, 1), o);
  CHECK(engine.sqpoll());
  ferry::io::aligned_buffer memory(32 * 4096, 4096);
  run_batches(engine, memory.span(), 4096, 6);
  CHECK(engine.stats().completed == 64);
}

TEST_CASE("uring_engine passes every result through the syscalls hook", "[io][uring]") {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  ferry::io::faulty_syscalls<> sys(plan);
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::uring_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), {});
  ferry::io::aligned_buffer memory(4096, 4096);
  const auto rule = plan->add({.call = ferry::io::syscall_kind::pwrite, .error = EIO, .path_contains = path.str()});
  io_request w{op_kind::write, 0, 0, memory.data(), 4096, &counter::on_complete, nullptr};
  counter c;
  w.context = &c;
  io_request* p = &w;
  engine.submit(std::span<io_request* const>(&p, 1));
  c.wait_for(1);
  CHECK(c.worst_result() == -EIO);
  CHECK(plan->fired(rule) == 1);
}
#endif

#if FERRY_HAS_URING
namespace {

// A rule that makes every io_uring setup answer `error`.
std::shared_ptr<ferry::io::fault_plan> refusing_plan(int error, std::size_t& rule) {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  rule = plan->add(
      {.call = ferry::io::syscall_kind::uring_queue_init, .error = error, .times = ferry::io::fault::forever});
  return plan;
}

}  // namespace

TEST_CASE("auto_engine runs io_uring where the kernel allows it", "[io][uring]") {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 4;
  ferry::io::auto_engine<> engine(sys, std::span<const int>(&fd, 1), o);
  CHECK(engine.kind() == ferry::io::engine_kind::uring);
  CHECK(engine.running_name() == "io_uring");
  CHECK(engine.operation(op_kind::read) == "io_uring read");
  CHECK_FALSE(engine.fell_back());
  CHECK(engine.fallback_reason().empty());
  CHECK(engine.fallback_errno() == 0);
  REQUIRE(engine.uring() != nullptr);
  CHECK(engine.thread_pool() == nullptr);
  CHECK(engine.uring()->queue_depth() == 4);
  ferry::io::aligned_buffer memory(64 * 4096, 4096);
  run_batches(engine, memory.span(), 4096, 2);
  CHECK(engine.stats().completed == 128);
  CHECK(engine.stats().submit_calls > 0);  // io_uring_submit calls: the ring ran them
}

TEST_CASE("auto_engine runs the thread pool where io_uring is refused, and says why", "[io][uring]") {
  const auto [error, name] =
      GENERATE(table<int, std::string>({{EPERM, "EPERM"}, {EACCES, "EACCES"}, {ENOSYS, "ENOSYS"}}));
  const bool sqpoll = GENERATE(false, true);
  INFO("errno " << name << (sqpoll ? ", SQPOLL" : ""));
  std::size_t rule = 0;
  ferry::io::faulty_syscalls<> sys(refusing_plan(error, rule));
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 4;
  o.threads = 3;
  o.sqpoll = sqpoll;
  ferry::io::auto_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), o);
  // A refusal is not retried with other setup flags; a refused SQPOLL ring is tried again
  // without SQPOLL (refused too here).
  CHECK(sys.plan()->fired(rule) == (sqpoll ? 2u : 1u));
  CHECK(engine.kind() == ferry::io::engine_kind::thread_pool);
  CHECK(engine.running_name() == "thread_pool");
  CHECK(engine.operation(op_kind::read) == "pread");
  CHECK(engine.operation(op_kind::write) == "pwrite");
  CHECK(engine.fell_back());
  CHECK(engine.fallback_errno() == error);
  const std::string refused = ": " + std::generic_category().message(error) + " (" + name + ")";
  CHECK(engine.fallback_reason() == (sqpoll ? "io_uring_queue_init (SQPOLL)" + refused + ", then " : std::string()) +
                                        "io_uring_queue_init" + refused + "; running the thread-pool engine");
  REQUIRE(engine.thread_pool() != nullptr);
  CHECK(engine.uring() == nullptr);
  CHECK(engine.thread_pool()->threads() == 3);
  CHECK_FALSE(engine.fixed_files());
  CHECK_FALSE(engine.sqpoll());
  ferry::io::aligned_buffer memory(64 * 4096, 4096);
  CHECK_FALSE(engine.register_buffer(memory.span()));
  run_batches(engine, memory.span(), 4096, 3);
  CHECK(engine.stats().completed == 128);
  CHECK(engine.stats().submit_calls == 0);  // no ring: pread/pwrite on the workers
}

TEST_CASE("auto_engine runs io_uring without SQPOLL where only SQPOLL is refused, and says why", "[io][uring]") {
  // Kernels before 5.11 refuse SQPOLL to unprivileged users with EPERM and allow a plain ring.
  auto plan = std::make_shared<ferry::io::fault_plan>();
  const std::size_t rule = plan->add({.call = ferry::io::syscall_kind::uring_queue_init,
                                      .error = EPERM,
                                      .open_flags = static_cast<int>(IORING_SETUP_SQPOLL),
                                      .times = ferry::io::fault::forever});
  ferry::io::faulty_syscalls<> sys(plan);
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 4;
  o.sqpoll = true;
  ferry::io::auto_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), o);
  CHECK(plan->fired(rule) == 1);
  CHECK(engine.kind() == ferry::io::engine_kind::uring);
  CHECK_FALSE(engine.fell_back());  // still io_uring
  CHECK_FALSE(engine.sqpoll());
  CHECK(engine.fallback_errno() == EPERM);
  CHECK(engine.fallback_reason() == "io_uring_queue_init (SQPOLL): " + std::generic_category().message(EPERM) +
                                        " (EPERM); running io_uring without SQPOLL");
  ferry::io::aligned_buffer memory(64 * 4096, 4096);
  run_batches(engine, memory.span(), 4096, 2);
  CHECK(engine.stats().completed == 128);
  CHECK(engine.stats().submit_calls > 0);  // the ring ran them
}

TEST_CASE("io_uring_enter refused alone (a seccomp filter): auto_engine runs the thread pool, uring_engine throws",
          "[io][uring]") {
  // The ring's setup is allowed, io_uring_enter is not: the engine's NOP probe at setup
  // finds it (before, the first submit was a fatal error on the ring thread).
  const bool sqpoll = GENERATE(false, true);
  INFO((sqpoll ? "SQPOLL" : "no SQPOLL"));
  auto plan = std::make_shared<ferry::io::fault_plan>();
  const std::size_t rule =
      plan->add({.call = ferry::io::syscall_kind::uring_enter, .error = EPERM, .times = ferry::io::fault::forever});
  ferry::io::faulty_syscalls<> sys(plan);
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  ferry::io::engine_options o;
  o.queue_depth = 4;
  o.sqpoll = sqpoll;
  {
    ferry::io::auto_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), o);
    CHECK(plan->fired(rule) == (sqpoll ? 2u : 1u));
    CHECK(engine.kind() == ferry::io::engine_kind::thread_pool);
    const std::string refused = "io_uring_enter: " + std::generic_category().message(EPERM) + " (EPERM)";
    CHECK(engine.fallback_reason() ==
          (sqpoll ? refused + ", then " : std::string()) + refused + "; running the thread-pool engine");
    ferry::io::aligned_buffer memory(64 * 4096, 4096);
    run_batches(engine, memory.span(), 4096, 3);
    CHECK(engine.stats().completed == 128);
  }
  try {
    ferry::io::uring_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), o);
    FAIL("the engine started");
  } catch (const ferry::io::uring_setup_error& e) {
    CHECK(e.code().value() == EPERM);
    CHECK(e.refused());
    CHECK(e.operation() == "io_uring_enter");
  }
}

TEST_CASE("auto_engine throws the other failures of io_uring's setup (ENOMEM, EINVAL)", "[io][uring]") {
  const int error = GENERATE(ENOMEM, EINVAL);
  std::size_t rule = 0;
  ferry::io::faulty_syscalls<> sys(refusing_plan(error, rule));
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  try {
    ferry::io::auto_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), {});
    FAIL("the engine started");
  } catch (const ferry::io::uring_setup_error& e) {
    CHECK(e.code().value() == error);
    CHECK(e.code().category() == std::generic_category());
    CHECK_FALSE(e.refused());
    CHECK(e.operation() == "io_uring_queue_init");
    CHECK(e.path() == "io_uring");
    CHECK_THAT(std::string(e.what()), Catch::Contains("io_uring_queue_init"));
  }
  // EINVAL is what a kernel answers to setup flags it does not know: each set is tried.
  CHECK(sys.plan()->fired(rule) == (error == EINVAL ? 3u : 1u));
}

TEST_CASE("uring_engine never falls back: a refused ring is a uring_setup_error", "[io][uring]") {
  std::size_t rule = 0;
  ferry::io::faulty_syscalls<> sys(refusing_plan(EPERM, rule));
  scratch_path path(ferry_test::disk_dir);
  direct_file file(sys, path.str(), {.mode = compat_mode::direct});
  const int fd = file.fd();
  try {
    ferry::io::uring_engine<ferry::io::faulty_syscalls<>> engine(sys, std::span<const int>(&fd, 1), {});
    FAIL("the engine started");
  } catch (const ferry::io::uring_setup_error& e) {
    CHECK(e.code().value() == EPERM);
    CHECK(e.refused());
    CHECK(e.operation() == "io_uring_queue_init");
  }
  CHECK(sys.plan()->fired(rule) == 1);
}
#endif
