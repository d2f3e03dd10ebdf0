// The caller's stream of ferry._core's bindings (core.cpp, layers.cpp): on the CPU model the
// Python thread's work is a stream of its own, standing where torch's current stream
// stands on CUDA, so the store and the stack order their work against it with the same
// events as on a GPU. A base class declared before the one that owns the store or stack,
// so that it outlives it (their events wait on it until they go).
#pragma once

#include <ferry/cuda/cpu_runtime.hpp>

namespace ferry_python {

struct cpu_caller {
  ferry::cpu_stream caller;
  [[nodiscard]] ferry::cpu_stream_ref ref() const { return ferry::cpu_stream_ref(caller.get()); }
};

}  // namespace ferry_python
