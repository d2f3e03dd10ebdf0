// ferry._core.NvmeStates and ferry._core.FaultPlan (states.cpp): added to the module by
// core.cpp.
#pragma once

#include <nanobind/nanobind.h>

void bind_nvme_states(nanobind::module_& m);
