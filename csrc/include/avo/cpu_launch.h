// Host-side helpers for generated CPU kernels. No torch headers: the binding layer
// splits the work into chunks (at::parallel_for) and calls the kernel per chunk.
#pragma once

#include "dtype.h"
#include "map_args.h"

namespace avo {

template <typename T>
struct HostTypeTag {
  using type = T;
};

// Calls f(HostTypeTag<element type>{}) for the host element type of `dtype`.
template <typename F>
void visit_host_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32: f(HostTypeTag<float>{}); break;
    case DType::Float16: f(HostTypeTag<Half>{}); break;
    case DType::BFloat16: f(HostTypeTag<BFloat16>{}); break;
  }
}

}  // namespace avo
