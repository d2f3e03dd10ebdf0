// ferry._core.FaultPlan's C++ side: a `ferry::io::fault_plan` shared by the Python object
// and the files made with it (NvmeStates, a LayerStack with its weights on NVMe), so that
// tests fail chosen calls of a file (states.cpp binds it).
#pragma once

#include <ferry/io/syscalls.hpp>

#include <memory>

namespace ferry_python {

struct fault_plan_handle {
  std::shared_ptr<ferry::io::fault_plan> plan = std::make_shared<ferry::io::fault_plan>();
};

}  // namespace ferry_python
