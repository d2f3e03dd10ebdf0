// ferry::error and its family: types, catchability, and messages that carry the
// site, the condition or call, and the values involved.
#include <ferry/core/error.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace {

// Each ferry exception derives from ferry::error and from exactly one standard one,
// so `catch (const std::exception&)` is unambiguous.
static_assert(std::is_base_of_v<ferry::error, ferry::logic_error>);
static_assert(std::is_base_of_v<std::logic_error, ferry::logic_error>);
static_assert(std::is_base_of_v<ferry::error, ferry::cuda_error>);
static_assert(std::is_base_of_v<std::runtime_error, ferry::cuda_error>);
static_assert(std::is_base_of_v<ferry::error, ferry::io_error>);
static_assert(std::is_base_of_v<std::system_error, ferry::io_error>);
static_assert(std::is_base_of_v<ferry::error, ferry::out_of_capacity>);
static_assert(std::is_base_of_v<std::bad_alloc, ferry::out_of_capacity>);
static_assert(std::is_base_of_v<ferry::error, ferry::config_error>);
static_assert(std::is_base_of_v<std::runtime_error, ferry::config_error>);
static_assert(!std::is_base_of_v<std::exception, ferry::error>);
// Copying an exception must not throw (std::exception_ptr, rethrow).
static_assert(std::is_nothrow_copy_constructible_v<ferry::out_of_capacity>);
static_assert(std::is_nothrow_copy_constructible_v<ferry::logic_error>);

bool contains_all(const std::string& text, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) {
    if (text.find(p) == std::string::npos) {
      UNSCOPED_INFO("missing: " << p);
      return false;
    }
  }
  return true;
}

int evaluations = 0;
int counted(int v) {
  ++evaluations;
  return v;
}

enum class colour : int { red = 7 };
struct opaque {
  int a, b;
};

constexpr int check_block_line = __LINE__ + 2;  // the line of the FERRY_EXPECTS below
void check_block(std::size_t bytes, std::size_t align) {
  FERRY_EXPECTS(bytes % align == 0, "block size must be a multiple of the alignment", bytes, align);
}

}  // namespace

TEST_CASE("FERRY_EXPECTS passes silently and evaluates nothing else when the condition holds") {
  evaluations = 0;
  FERRY_EXPECTS(1 + 1 == 2, counted(1), counted(2), counted(3));
  CHECK(evaluations == 0);
  CHECK_NOTHROW(check_block(8192, 4096));
}

TEST_CASE("FERRY_EXPECTS throws ferry::logic_error: message and values first, then condition and site") {
  try {
    check_block(4097, 4096);
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(
        what.starts_with("block size must be a multiple of the alignment [bytes = 4097, align = 4096] (precondition "
                         "`bytes % align == 0` at "));
    CHECK(what.ends_with(":" + std::to_string(check_block_line) + " in check_block)"));
    CHECK(what.find("test_error.cpp:") != std::string::npos);
    CHECK(std::string(e.where().file).find("test_error.cpp") != std::string::npos);
    CHECK(e.where().line == check_block_line);
    CHECK(std::string(e.where().function) == "check_block");
  }
}

TEST_CASE("ferry exceptions are caught as ferry::error and as their standard base") {
  CHECK_THROWS_AS(check_block(1, 4096), std::logic_error);
  CHECK_THROWS_AS(check_block(1, 4096), std::exception);
  bool caught = false;
  try {
    check_block(1, 4096);
  } catch (const ferry::error& e) {
    caught = std::string(e.what()).find("bytes = 1") != std::string::npos;
  }
  CHECK(caught);

  CHECK_THROWS_AS(FERRY_THROW_OUT_OF_CAPACITY("pinned_pool", 10, 5, 8), std::bad_alloc);
  CHECK_THROWS_AS(FERRY_THROW_IO_ERROR(EIO, "pread", "/x", 0, 1), std::system_error);
  CHECK_THROWS_AS(FERRY_THROW_IO_ERROR(EIO, "pread", "/x", 0, 1), std::exception);
}

TEST_CASE("values in messages are printed by kind") {
  const bool flag = false;
  const char letter = 'A';
  const colour c = colour::red;
  const std::string path = "/mnt/nvme0/x";
  const char* cstr = "abc";
  const opaque o{1, 2};
  const double ratio = 0.5;
  try {
    FERRY_EXPECTS(flag, "kinds", flag, letter, c, path, cstr, o, ratio);
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains_all(what, {"flag = false", "letter = 65", "c = 7", "path = \"/mnt/nvme0/x\"", "cstr = \"abc\"",
                              "o = <8-byte value>", "ratio = 0.5"}));
  }
}

TEST_CASE("values that are null, byte-sized, unterminated or hostile print safely") {
  const char* null_text = nullptr;
  const std::nullptr_t null_value = nullptr;
  const std::byte b = std::byte{0x41};
  const std::byte zero = std::byte{0};
  enum class small : unsigned char { one = 1 };
  const small s = small::one;
  const char unterminated[4] = {'a', 'b', 'c', 'd'};
  const std::string control = "line1\nline2\x1b[0m\"q\"";
  const int* null_pointer = nullptr;
  const int tail = 99;
  try {
    FERRY_EXPECTS(false, "hostile", null_text, null_value, b, zero, s, unterminated, control, null_pointer, tail);
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains_all(
        what, {"null_text = nullptr", "null_value = nullptr", "b = 65", "zero = 0", "s = 1", "unterminated = \"abcd\"",
               R"(control = "line1\nline2\x1b[0m\"q\"")", "null_pointer = nullptr", "tail = 99]"}));
    CHECK(what.find('\n') == std::string::npos);
  }
}

TEST_CASE("pointers print as addresses, not as the bool they convert to") {
  int x = 0;
  const int* p = &x;
  void* v = &x;
  try {
    FERRY_EXPECTS(false, "pointers", p, v);
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    std::ostringstream want;
    want << static_cast<const void*>(&x);
    const std::string what = e.what();
    INFO(what);
    CHECK(contains_all(what, {"p = " + want.str(), "v = " + want.str()}));
    CHECK(what.find("p = 1") == std::string::npos);
  }
}

struct throws_when_printed {
  int v = 0;
  friend std::ostream& operator<<(std::ostream& os, const throws_when_printed&) {
    throw std::runtime_error("printing failed");
    return os;
  }
};

TEST_CASE("a value whose operator<< throws does not replace the precondition failure") {
  const throws_when_printed t;
  const int after = 5;
  const char* no_message = nullptr;
  try {
    FERRY_EXPECTS(false, no_message, t, after);
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains_all(what, {"(no message)", "t = <operator<< threw>", "after = 5]"}));
  }
}

TEST_CASE("FERRY_EXPECTS takes many values, and parenthesised arguments with commas") {
  const int a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8, i = 9, j = 10, k = 11, l = 12;
  try {
    FERRY_EXPECTS(a > l, "twelve", a, b, c, d, e, f, g, h, i, j, k, l, (std::max(a, b)));
    FAIL("no exception");
  } catch (const ferry::logic_error& ex) {
    const std::string what = ex.what();
    INFO(what);
    CHECK(contains_all(what, {"[a = 1, b = 2, c = 3,", "k = 11, l = 12, (std::max(a, b)) = 2]"}));
  }
}

TEST_CASE("ferry::named gives a value the name the message shows") {
  struct element_type {
    double x;
  };
  struct options {
    int devices = 0;
  } o;
  std::string path = "/mnt/nvme0/x";
  evaluations = 0;
  FERRY_EXPECTS(true, "not shown", ferry::named("never", counted(1)));
  CHECK(evaluations == 0);  // evaluated only on failure, as the other values
  try {
    FERRY_EXPECTS(o.devices >= 1, "a device at least", ferry::named("element", sizeof(element_type)),
                  ferry::named("devices", o.devices), o.devices, ferry::named("path", path));
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains_all(what, {"`o.devices >= 1`", "a device at least",
                              "[element = 8, devices = 0, o.devices = 0, path = \"/mnt/nvme0/x\"]"}));
    CHECK(what.find("sizeof") == std::string::npos);  // the name replaces the expression text
    CHECK(what.find("named(") == std::string::npos);
  }
  static_assert(std::is_same_v<decltype(ferry::named("n", o.devices)), ferry::named_arg<int&>>);  // no copy
  static_assert(std::is_same_v<decltype(ferry::named("n", 4)), ferry::named_arg<int>>);           // kept
}

TEST_CASE("ferry::named names values of FERRY_RUNTIME_TRY too") {
  struct fake_runtime {
    static bool ok(int status) noexcept { return status == 0; }
    static std::string describe(int status) { return "status " + std::to_string(status); }
    [[noreturn]] static void raise(int status, const std::string& message, ferry::source_site site) {
      throw ferry::device_error(message, status, site);
    }
  };
  const std::size_t n = 4096;
  try {
    FERRY_RUNTIME_TRY(fake_runtime, 3 + 0 * static_cast<int>(n), ferry::named("bytes", n + 1));
    FAIL("no exception");
  } catch (const ferry::device_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains_all(what, {"failed: status 3", "[bytes = 4097]"}));
    CHECK(e.code() == 3);
  }
}

TEST_CASE("a message without values has no value list") {
  try {
    FERRY_EXPECTS(false, "nothing to show");
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    CHECK(what.find('[') == std::string::npos);
    CHECK(what.size() > std::strlen("nothing to show"));
  }
}

TEST_CASE("io_error carries errno, path, offset and size") {
  try {
    FERRY_THROW_IO_ERROR(ENOSPC, "pwrite", std::string("/mnt/nvme0/ferry.0"), 1048576, 4097);
    FAIL("no exception");
  } catch (const ferry::io_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.code().value() == ENOSPC);
    CHECK(e.code().category() == std::generic_category());
    CHECK(e.code() == std::errc::no_space_on_device);
    CHECK(e.path() == "/mnt/nvme0/ferry.0");
    CHECK(e.offset() == 1048576);
    CHECK(e.bytes() == 4097);
    // The cause, then the site last.
    CHECK(what.starts_with(std::string("pwrite of 4097 bytes on '/mnt/nvme0/ferry.0' at offset 1048576 failed: ") +
                           std::strerror(ENOSPC)));
    CHECK(what.find(" (at ") > what.find(std::strerror(ENOSPC)));
    CHECK(what.find("test_error.cpp:") > what.find(" (at "));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    CHECK(what.find(" (ENOSPC) (at ") != std::string::npos);
#endif
  }
  try {
    FERRY_THROW_IO_ERROR(ENOENT, "open", "/nope", ferry::io_error::no_offset, 0);
    FAIL("no exception");
  } catch (const ferry::io_error& e) {
    const std::string what = e.what();
    CHECK(what.find("at offset") == std::string::npos);
    CHECK(e.offset() == ferry::io_error::no_offset);
    CHECK(e.code() == std::errc::no_such_file_or_directory);
  }
}

TEST_CASE("out_of_capacity names the resource, the request, the use and the capacity") {
  try {
    FERRY_THROW_OUT_OF_CAPACITY("pinned_pool", 4096, 1000, 4500);
    FAIL("no exception");
  } catch (const ferry::out_of_capacity& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.requested() == 4096);
    CHECK(e.used() == 1000);
    CHECK(e.capacity() == 4500);
    CHECK(what.starts_with("pinned_pool cannot hold 4096 more bytes: 1000 of 4500 bytes in use (at "));
    CHECK(what.find("test_error.cpp:") != std::string::npos);
    CHECK(what.find("larger than the whole capacity") == std::string::npos);
    // A copy keeps the message (the exception may be copied by the runtime).
    const ferry::out_of_capacity copy = e;
    CHECK(std::string(copy.what()) == what);
  }
  try {
    FERRY_THROW_OUT_OF_CAPACITY("device_arena", 10000, 0, 4500);
    FAIL("no exception");
  } catch (const std::bad_alloc& e) {
    CHECK(std::string(e.what()).find("larger than the whole capacity") != std::string::npos);
  }
}

TEST_CASE("cuda_error keeps its code and exists without CUDA") {
  const ferry::cuda_error e("cudaMalloc failed", 2, ferry::source_site{"f.cpp", 3, "g"});
  CHECK(e.code() == 2);
  CHECK(std::string(e.what()) == "cudaMalloc failed");
  CHECK(e.where().line == 3);
}

TEST_CASE("a message names its site by the path from ferry/ on") {
  CHECK(std::string_view(ferry::detail::short_file("/usr/include/ferry/io/uring.hpp")) == "ferry/io/uring.hpp");
  CHECK(std::string_view(ferry::detail::short_file("/work/ferry/include/ferry/io/uring.hpp")) == "ferry/io/uring.hpp");
  CHECK(std::string_view(ferry::detail::short_file("ferry/core/error.hpp")) == "ferry/core/error.hpp");
  CHECK(std::string_view(ferry::detail::short_file("/src/tests/test_x.cpp")) == "/src/tests/test_x.cpp");
  CHECK(std::string_view(ferry::detail::short_file("/a/notferry/x.hpp")) == "/a/notferry/x.hpp");
  CHECK(std::string_view(ferry::detail::short_file("")).empty());
}

TEST_CASE("the destructor error handler can be replaced and restored") {
  static int calls = 0;
  const ferry::destructor_error_handler mine = [](const char*) noexcept { ++calls; };
  const ferry::destructor_error_handler original = ferry::set_destructor_error_handler(mine);
  CHECK(original != nullptr);
  CHECK(original != mine);
  const ferry::destructor_error_handler back = ferry::set_destructor_error_handler(nullptr);
  CHECK(back == mine);
  // nullptr restored the default one.
  CHECK(ferry::set_destructor_error_handler(original) == original);
  CHECK(calls == 0);
}

TEST_CASE("a value's name drops the spelling of ferry's members, not the reader's words") {
  const auto name_of = [](const char* expression) {
    std::ostringstream os;
    ferry::detail::put_name(os, expression);
    return std::move(os).str();
  };
  CHECK(name_of("o_.device_blocks") == "device_blocks");
  CHECK(name_of("options_.block_tokens") == "block_tokens");
  CHECK(name_of("tiers_.size()") == "tiers.size()");
  CHECK(name_of("depth_") == "depth");
  CHECK(name_of("this->depth_") == "depth");
  CHECK(name_of("seq.blocks_.size() * o_.block_tokens") == "seq.blocks.size() * block_tokens");
  CHECK(name_of("follows_->key_at(e)") == "follows->key_at(e)");
  CHECK(name_of("bytes % align") == "bytes % align");
  CHECK(name_of("_") == "_");
  CHECK(name_of("") == "");
  CHECK(name_of(nullptr) == "");
}
