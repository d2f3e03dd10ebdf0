// ferry._core.NvmeStates: the states of `OffloadAdamW(nvme_path=...)` on NVMe.
//
// One file (a `ferry::nvme_tier` of `capacity` bytes, locked while the object lives,
// removed when it goes) and one `ferry::state_swapper` over it whose groups are the
// optimizer's parameters, in param-group order. Each group holds two fp32 arrays,
// [exp_avg | exp_avg_sq], while every parameter is float32 (its own master weights: the
// swapper keeps no master arrays, `keep_master` off, a third less file space, pinned
// memory and I/O than [master | m | v]); a layout with a bfloat16 or float16 parameter
// keeps master arrays (`layout(..., keep_master=True)`), each such parameter's float32
// master is stepped and the parameter becomes it rounded to nearest even (a float32
// parameter's master array holds NaN once it is stepped: stale). Before the step, a
// parameter that is not its master rounded (changed since: a checkpoint of the model
// loaded, an edit) re-seeds the master from it, as `OffloadAdamW`'s pinned states do.
// The groups that fit
// `ram_budget_bytes` stay in the swapper's pinned memory and are stepped in place, the
// rest are streamed through its ring of three buffers: group g+1 read and g-1 written
// while ferry's CPU AdamW steps g, in place on the caller's parameter.
//
// A step stopped by an I/O error
// leaves each parameter with its group: a group whose new states reached the file keeps
// its stepped parameter; one whose write failed (or never ran) gets its parameter back as
// it was before the step, from an undo copy of the last three streamed groups stepped (no
// more can be unconfirmed: a ring buffer is reused only once its write has completed).
// `step` then reports the groups updated (`last_updated`); the caller finishes the step by
// stepping the others in its next call, so no group is stepped twice, none skipped, even
// across a new layout. Each call steps the groups of its entries only
// (`state_swapper::step_groups`): the others are neither read nor written.
//
// `FaultPlan` is `ferry::io::fault_plan`, for the package's tests: an `NvmeStates` made
// with one runs its file's calls through `ferry::io::faulty_syscalls`, which fails them as
// the plan says (the same file, engine and swapper otherwise).
#include "states.hpp"

#include <ferry/core/error.hpp>
#include <ferry/io/syscalls.hpp>
#include <ferry/pipeline/state_swapper.hpp>
#include <ferry/tier/nvme_tier.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "adamw.hpp"
#include "fault_plan.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace {

using ferry_python::adamw_runner;
using ferry_python::f32_array;
using ferry_python::precision;

inline std::size_t bytes_of(precision p) { return p == precision::f32 ? 4 : 2; }

// One parameter's step: group g, its tensor and gradient (n elements each, of `type`),
// its constants.
struct entry {
  std::size_t group = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  std::size_t n = 0;
  precision type = precision::f32;
  ferry::adamw_constants constants;
};

ferry::state_part part_of(const std::string& name) {
  if (name == "master") return ferry::state_part::master;
  if (name == "exp_avg") return ferry::state_part::m;
  if (name == "exp_avg_sq") return ferry::state_part::v;
  throw nb::value_error(("ferry: no state named '" + name + "' (master, exp_avg, exp_avg_sq)").c_str());
}

class states_base {
 public:
  states_base() = default;
  states_base(const states_base&) = delete;
  states_base& operator=(const states_base&) = delete;
  virtual ~states_base() = default;
  virtual void layout(const std::vector<std::size_t>& sizes, const std::vector<std::int64_t>& from,
                      bool keep_master) = 0;
  virtual void initialize(std::size_t g, std::span<const float> m, std::span<const float> v,
                          std::span<const float> master) = 0;
  [[nodiscard]] virtual bool keeps_master() const = 0;
  [[nodiscard]] virtual bool initialized(std::size_t g) const = 0;
  virtual void read(std::size_t g, ferry::state_part part, std::span<float> out) = 0;
  // Steps the groups of `entries` (the other groups keep their states); returns those
  // updated by this call. Throws as the swapper does, with `updated` set first.
  virtual void step(adamw_runner& adamw, const std::vector<entry>& entries, std::vector<std::size_t>& updated) = 0;
  [[nodiscard]] virtual std::size_t groups() const = 0;
  [[nodiscard]] virtual std::size_t elements(std::size_t g) const = 0;
  virtual void stats(nb::dict& d) const = 0;
};

template <class Sys>
class states_on final : public states_base {
 public:
  using tier_type = ferry::basic_nvme_tier<Sys>;
  using swapper_type = ferry::state_swapper<tier_type>;

  states_on(ferry::nvme_options options, Sys sys, std::size_t ram_budget_bytes)
      : tier_(std::move(options), std::move(sys)), budget_(ram_budget_bytes) {}

  // A swapper for groups of `sizes` elements; group g takes the states of the old
  // swapper's group `from[g]` (-1: none, left uninitialized). The old one stays until the
  // new one is complete: any error leaves it as it was.
  void layout(const std::vector<std::size_t>& sizes, const std::vector<std::int64_t>& from, bool keep_master) override {
    if (sizes.empty()) throw nb::value_error("ferry: NvmeStates.layout of no parameters");
    if (from.size() != sizes.size()) throw nb::value_error("ferry: NvmeStates.layout: one source per group");
    // The file must hold every group's two copies even while the pinned memory holds them
    // all: a wrong capacity is said at once, not when the model has grown.
    const std::size_t a = tier_.alignment();
    const std::size_t arrays = keep_master ? 3 : 2;
    std::size_t need = 0;
    for (const std::size_t n : sizes) need += 2 * arrays * ((n * sizeof(float) + a - 1) / a * a);
    if (need > tier_.capacity()) {
      throw ferry::out_of_capacity(std::string("the NVMe file of the optimizer states (2 copies of ") +
                                       (keep_master ? "the master, exp_avg and exp_avg_sq" : "exp_avg and exp_avg_sq") +
                                       " per parameter, each padded to " + std::to_string(a) + " bytes; nvme_bytes)",
                                   need, 0, tier_.capacity(), FERRY_DETAIL_SITE());
    }
    ferry::state_swapper_options o;
    o.ram_budget_bytes = budget_;
    o.keep_master = keep_master;  // off: the caller's fp32 parameters are the masters
    auto fresh = std::make_unique<swapper_type>(tier_, std::span<const std::size_t>(sizes), o);
    if (swapper_) {
      std::vector<float> master;
      std::vector<float> m;
      std::vector<float> v;
      for (std::size_t g = 0; g < sizes.size(); ++g) {
        if (from[g] < 0) continue;
        const auto old = static_cast<std::size_t>(from[g]);
        if (old >= swapper_->groups() || !swapper_->initialized(old)) continue;
        if (swapper_->layout(old).elements != sizes[g]) {
          throw nb::value_error(("ferry: NvmeStates.layout: group " + std::to_string(g) + " has " +
                                 std::to_string(sizes[g]) + " elements, its source " + std::to_string(old) + " " +
                                 std::to_string(swapper_->layout(old).elements))
                                    .c_str());
        }
        m.resize(sizes[g]);
        v.resize(sizes[g]);
        swapper_->read(old, ferry::state_part::m, m);
        swapper_->read(old, ferry::state_part::v, v);
        master.clear();
        if (keep_master) {
          master.resize(sizes[g]);  // zeros where the old layout kept none: the next step re-seeds it
          if (keep_master_) swapper_->read(old, ferry::state_part::master, master);
        }
        fresh->initialize(g, master, m, v);
      }
    }
    std::size_t largest = 0;
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      if (!fresh->layout(g).resident) largest = std::max(largest, sizes[g]);
    }
    std::array<std::vector<std::byte>, undo_slots> undo;
    for (auto& u : undo) u.resize(largest * sizeof(float));
    swapper_ = std::move(fresh);
    keep_master_ = keep_master;
    undo_ = std::move(undo);
  }

  void initialize(std::size_t g, std::span<const float> m, std::span<const float> v,
                  std::span<const float> master) override {
    swapper_type& s = sw();
    if (!keep_master_ && !master.empty()) {
      throw nb::value_error("ferry: NvmeStates.initialize: a master for a layout that keeps none");
    }
    std::vector<float> zeros;
    if (keep_master_ && master.empty()) {
      zeros.resize(s.layout(g).elements);  // re-seeded from the parameter by its next step
      master = zeros;
    }
    s.initialize(g, master, m, v);
  }
  [[nodiscard]] bool keeps_master() const override { return keep_master_; }
  [[nodiscard]] bool initialized(std::size_t g) const override { return sw().initialized(g); }
  void read(std::size_t g, ferry::state_part part, std::span<float> out) override { sw().read(g, part, out); }
  [[nodiscard]] std::size_t groups() const override { return swapper_ ? swapper_->groups() : 0; }
  [[nodiscard]] std::size_t elements(std::size_t g) const override { return sw().layout(g).elements; }

  void step(adamw_runner& adamw, const std::vector<entry>& entries, std::vector<std::size_t>& updated) override {
    swapper_type& s = sw();
    const std::size_t groups = s.groups();
    std::vector<const entry*> of(groups, nullptr);
    std::vector<char> resident(groups, 0);
    for (std::size_t g = 0; g < groups; ++g) resident[g] = s.layout(g).resident ? 1 : 0;
    for (const entry& e : entries) {
      if (e.type != precision::f32 && !keep_master_) {
        throw nb::value_error(("ferry: NvmeStates.step: a bfloat16 or float16 parameter (group " +
                               std::to_string(e.group) + ") in a layout without master arrays")
                                  .c_str());
      }
      if (e.group >= groups || e.n != s.layout(e.group).elements || of[e.group] != nullptr) {
        throw nb::value_error(("ferry: NvmeStates.step: a parameter of " + std::to_string(e.n) +
                               " elements for group " + std::to_string(e.group) + " of " + std::to_string(groups) +
                               " (given twice, out of range or of another size)")
                                  .c_str());
      }
      of[e.group] = &e;
    }
    // Only the entries' groups are read, stepped and written (`step_groups`): a group
    // without a gradient keeps its states untouched, and a caller stepping its parameters
    // in parts (a layer at a time, with the weights on NVMe) moves each group's states once.
    std::vector<std::size_t> chosen;
    chosen.reserve(entries.size());
    for (const entry& e : entries) chosen.push_back(e.group);
    std::array<std::size_t, undo_slots> undone{};
    undone.fill(none);
    std::vector<char> computed(groups, 0);
    std::size_t streamed = 0;
    const auto compute = [&](std::size_t g, ferry::group_view view) {
      const entry* e = of[g];
      if (e == nullptr) return;  // no gradient: the group keeps its states
      if (resident[g] == 0) {
        const std::size_t slot = streamed++ % undo_slots;
        std::memcpy(undo_[slot].data(), e->param, e->n * bytes_of(e->type));
        undone[slot] = g;
      }
      if (e->type == precision::f32) {
        adamw.step_spans(std::span<float>(static_cast<float*>(e->param), e->n),
                         std::span<const float>(static_cast<const float*>(e->grad), e->n), view.m, view.v,
                         e->constants);
        // A float32 parameter is its own master: its master array (a layout that keeps
        // them) is stale from now on. NaN rounds to no value but NaN, so a parameter made
        // 16-bit later re-seeds it from itself, as the pinned path makes it a new master.
        std::fill(view.master.begin(), view.master.end(), std::numeric_limits<float>::quiet_NaN());
      } else {
        step_low(adamw, *e, view);
      }
      computed[g] = 1;
    };
    std::exception_ptr error;
    {
      const nb::gil_scoped_release unlocked;
      try {
        s.step_groups(compute, chosen);
      } catch (...) {
        error = std::current_exception();
      }
    }
    // A group stepped whose new states did not reach the file gets its parameter back.
    for (std::size_t slot = 0; slot < undo_slots; ++slot) {
      const std::size_t g = undone[slot];
      if (g == none || s.updated(g)) continue;
      const entry* e = of[g];
      std::memcpy(e->param, undo_[slot].data(), e->n * bytes_of(e->type));
      computed[g] = 0;
    }
    updated.clear();
    for (std::size_t g = 0; g < groups; ++g) {
      if (computed[g] != 0 && s.updated(g)) updated.push_back(g);
    }
    for (std::size_t g = 0; g < groups; ++g) {
      if (computed[g] != 0 && !s.updated(g)) {
        // Cannot happen (see the file comment); never leave it unsaid.
        throw std::logic_error("ferry: NvmeStates.step: group " + std::to_string(g) +
                               " was stepped, not written, and had no undo copy");
      }
    }
    if (error) std::rethrow_exception(error);
  }

  void stats(nb::dict& d) const override {
    d["groups"] = groups();
    d["resident_groups"] = swapper_ ? swapper_->resident_groups() : 0;
    d["spilled_groups"] = swapper_ ? swapper_->groups() - swapper_->resident_groups() : 0;
    d["ring_bytes"] = swapper_ ? swapper_->ring_bytes() : 0;
    d["host_bytes"] = swapper_ ? swapper_->host_bytes() : 0;
    d["budget_bytes"] = swapper_ ? swapper_->budget_bytes() : budget_;
    d["undo_bytes"] = undo_[0].size() * undo_slots;
    d["bytes_per_element"] = (keep_master_ ? 3 : 2) * sizeof(float);  // [master |] exp_avg | exp_avg_sq
    d["keep_master"] = keep_master_;
    d["capacity_bytes"] = tier_.capacity();
    d["file_bytes_used"] = tier_.used();
    d["engine"] = std::string(tier_.engine_name());
    const auto files = tier_.files();
    d["direct_io"] = !files.empty() && files.front().mode == ferry::io::io_mode::direct;
    if (swapper_) {
      const ferry::state_swapper_stats& s = swapper_->stats();
      d["steps"] = s.steps;
      d["failed_steps"] = s.failed_steps;
      d["reads"] = s.reads;
      d["writes"] = s.writes;
      d["bytes_read"] = s.bytes_read;
      d["bytes_written"] = s.bytes_written;
    }
  }

 private:
  static constexpr std::size_t undo_slots = swapper_type::ring_slots;
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  // A bfloat16 or float16 parameter's step: the master re-seeded from the parameter where
  // the parameter is not the master rounded; the master stepped with the gradient widened
  // (exactly) to binary32; the parameter the master rounded to nearest even.
  void step_low(adamw_runner& adamw, const entry& e, ferry::group_view view) {
    adamw.step_low_spans(e.type, static_cast<std::uint16_t*>(e.param), static_cast<const std::uint16_t*>(e.grad),
                         view.master, view.m, view.v, e.constants);
  }

  [[nodiscard]] swapper_type& sw() const {
    if (!swapper_) throw nb::value_error("ferry: NvmeStates has no layout yet (layout() first)");
    return *swapper_;
  }

  tier_type tier_;
  std::size_t budget_;
  std::unique_ptr<swapper_type> swapper_;  // before tier_ goes: declared after it
  bool keep_master_ = false;
  std::array<std::vector<std::byte>, undo_slots> undo_;  // streamed groups' parameters before their step
};

ferry::io::syscall_kind call_of(const std::string& name) {
  using k = ferry::io::syscall_kind;
  if (name == "pread") return k::pread;
  if (name == "pwrite") return k::pwrite;
  if (name == "open") return k::open;
  if (name == "fsync") return k::fsync;
  if (name == "ftruncate") return k::ftruncate;
  if (name == "fallocate") return k::fallocate;
  throw nb::value_error(
      ("ferry: FaultPlan: no call named '" + name + "' (pread, pwrite, open, fsync, ftruncate, fallocate)").c_str());
}

using ferry_python::fault_plan_handle;

class nvme_states {
 public:
  nvme_states(const std::string& path, std::uint64_t capacity, std::size_t ram_budget_bytes,
              const fault_plan_handle* faults) {
    if (path.empty() || capacity == 0) {
      throw nb::value_error(("ferry: optimizer states on NVMe need a path and a capacity in bytes > 0 [nvme_path = '" +
                             path + "', nvme_bytes = " + std::to_string(capacity) + "]")
                                .c_str());
    }
    ferry::nvme_options o;
    o.paths = {path};
    o.capacity = capacity;
    const nb::gil_scoped_release unlocked;
    if (faults != nullptr) {
      impl_ = std::make_unique<states_on<ferry::io::faulty_syscalls<>>>(
          std::move(o), ferry::io::faulty_syscalls<>(faults->plan), ram_budget_bytes);
    } else {
      impl_ = std::make_unique<states_on<ferry::io::posix_syscalls>>(std::move(o), ferry::io::posix_syscalls{},
                                                                     ram_budget_bytes);
    }
  }

  void layout(const std::vector<std::size_t>& sizes, const std::vector<std::int64_t>& from, bool keep_master) {
    const nb::gil_scoped_release unlocked;
    impl_->layout(sizes, from, keep_master);
  }

  void initialize(std::size_t g, const std::optional<f32_array>& m, const std::optional<f32_array>& v,
                  const std::optional<f32_array>& master) {
    const auto span_of = [](const std::optional<f32_array>& a) {
      return a ? std::span<const float>(a->data(), a->shape(0)) : std::span<const float>();
    };
    const std::span<const float> mm = span_of(m);
    const std::span<const float> vv = span_of(v);
    const std::span<const float> ww = span_of(master);
    const nb::gil_scoped_release unlocked;
    impl_->initialize(g, mm, vv, ww);
  }

  [[nodiscard]] bool keeps_master() const { return impl_->keeps_master(); }

  [[nodiscard]] bool initialized(std::size_t g) const { return impl_->initialized(g); }

  void read(std::size_t g, const std::string& part, const f32_array& out) {
    const ferry::state_part p = part_of(part);
    const nb::gil_scoped_release unlocked;
    impl_->read(g, p, std::span<float>(out.data(), out.shape(0)));
  }

  // entries: (group, param, grad, lr, beta1, beta2, eps, weight_decay, step[, dtype]);
  // dtype "float32" (the default: param and grad float32 arrays), "bfloat16" or "float16"
  // (param and grad the 16-bit tensors viewed as int16). Returns the groups updated.
  // After an error, `last_updated` holds them.
  std::vector<std::size_t> step(adamw_runner& adamw, const nb::list& entries) {
    last_updated_.clear();  // whatever happens next, nothing of an earlier call is reported
    std::vector<entry> work;
    work.reserve(entries.size());
    for (nb::handle h : entries) {
      const auto t = nb::cast<nb::tuple>(h);
      if (t.size() != 9 && t.size() != 10) throw nb::value_error("ferry: NvmeStates.step: an entry of 9 or 10 items");
      entry e;
      const std::string type = t.size() == 10 ? nb::cast<std::string>(t[9]) : "float32";
      std::size_t n = 0;
      std::size_t grad_n = 0;
      if (type == "float32") {
        const auto param = nb::cast<ferry_python::f32_vector>(t[1], false);
        const auto grad = nb::cast<ferry_python::f32_vector>(t[2], false);
        e.param = param.data();
        e.grad = grad.data();
        n = param.shape(0);
        grad_n = grad.shape(0);
      } else if (type == "bfloat16" || type == "float16") {
        const auto param = nb::cast<ferry_python::i16_vector>(t[1], false);
        const auto grad = nb::cast<ferry_python::i16_vector>(t[2], false);
        e.type = type == "bfloat16" ? precision::bf16 : precision::f16;
        e.param = param.data();
        e.grad = grad.data();
        n = param.shape(0);
        grad_n = grad.shape(0);
      } else {
        throw nb::value_error(("ferry: NvmeStates.step: dtype '" + type + "' (float32, bfloat16, float16)").c_str());
      }
      if (n != grad_n) {
        throw nb::value_error(("ferry: NvmeStates.step: a parameter of " + std::to_string(n) +
                               " elements with a gradient of " + std::to_string(grad_n))
                                  .c_str());
      }
      e.group = nb::cast<std::size_t>(t[0]);
      e.n = n;
      e.constants = ferry::adamw_constants::from_double(nb::cast<double>(t[3]), nb::cast<double>(t[4]),
                                                        nb::cast<double>(t[5]), nb::cast<double>(t[6]),
                                                        nb::cast<double>(t[7]), nb::cast<std::uint64_t>(t[8]));
      work.push_back(e);
    }
    impl_->step(adamw, work, last_updated_);
    return last_updated_;
  }

  [[nodiscard]] const std::vector<std::size_t>& last_updated() const { return last_updated_; }
  [[nodiscard]] std::size_t groups() const { return impl_->groups(); }
  [[nodiscard]] nb::dict stats() const {
    nb::dict d;
    impl_->stats(d);
    return d;
  }

 private:
  std::unique_ptr<states_base> impl_;
  std::vector<std::size_t> last_updated_;
};

}  // namespace

void bind_nvme_states(nb::module_& m) {
  nb::class_<fault_plan_handle>(m, "FaultPlan",
                                "ferry::io::fault_plan for tests: failures an NvmeStates made with it injects into "
                                "its file's calls.")
      .def(nb::init<>())
      .def(
          "add",
          [](fault_plan_handle& h, const std::string& call, int error, std::size_t skip, std::size_t times) {
            ferry::io::fault f;
            f.call = call_of(call);
            f.error = error;
            f.skip = skip;
            f.times = times == 0 ? ferry::io::fault::forever : times;
            return h.plan->add(std::move(f));
          },
          nb::arg("call"), nb::arg("error"), nb::arg("skip") = 0, nb::arg("times") = 1,
          "Fails the call ('pread', 'pwrite', ...) with errno `error` after `skip` matching calls, `times` times "
          "(0: always); returns the rule's index.")
      .def(
          "fired", [](const fault_plan_handle& h, std::size_t i) { return h.plan->fired(i); }, nb::arg("index"),
          "How many calls rule `index` failed.")
      .def("clear", [](fault_plan_handle& h) { h.plan->clear(); }, "Removes every rule.");

  nb::class_<nvme_states>(m, "NvmeStates",
                          "Optimizer states (exp_avg, exp_avg_sq per parameter) in a ferry::state_swapper "
                          "over a ferry::nvme_tier file, stepped by ferry's CPU AdamW.")
      .def(nb::init<const std::string&, std::uint64_t, std::size_t, const fault_plan_handle*>(), nb::arg("path"),
           nb::arg("capacity"), nb::arg("ram_budget_bytes"), nb::arg("faults").none() = nb::none())
      .def("layout", &nvme_states::layout, nb::arg("sizes"), nb::arg("sources"), nb::arg("keep_master") = false,
           "Groups of these sizes; group g takes the states of the old group sources[g] (-1: none); keep_master: "
           "each group holds a float32 master array too (bfloat16 / float16 parameters).")
      .def("initialize", &nvme_states::initialize, nb::arg("group"), nb::arg("exp_avg").noconvert().none() = nb::none(),
           nb::arg("exp_avg_sq").noconvert().none() = nb::none(), nb::arg("master").noconvert().none() = nb::none(),
           "Sets a group's moments (zeros where None) and, with master arrays, its master (zeros where None: the "
           "next step re-seeds it from the parameter).")
      .def_prop_ro("keep_master", &nvme_states::keeps_master, "Whether the layout keeps master arrays.")
      .def("initialized", &nvme_states::initialized, nb::arg("group"))
      .def("read", &nvme_states::read, nb::arg("group"), nb::arg("part"), nb::arg("out").noconvert(),
           "Copies a group's 'exp_avg' or 'exp_avg_sq' into out.")
      .def("step", &nvme_states::step, nb::arg("adamw"), nb::arg("entries"),
           "Steps the groups of the entries (group, param, grad, lr, beta1, beta2, eps, weight_decay, step); returns "
           "the groups updated (after an error: last_updated).")
      .def_prop_ro("last_updated", &nvme_states::last_updated, "The groups the last step call updated.")
      .def_prop_ro("groups", &nvme_states::groups)
      .def("stats", &nvme_states::stats, "The file's and the swapper's figures.");
}
