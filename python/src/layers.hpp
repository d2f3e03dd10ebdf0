// ferry._core.LayerStack (layers.cpp): added to the module by core.cpp.
#pragma once

#include <nanobind/nanobind.h>

void bind_layer_stack(nanobind::module_& m);
