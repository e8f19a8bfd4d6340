// Arguments of an elementwise ("map") kernel: raw pointers, the broadcast shape and
// each input's strides. The binding layer fills this from tensors; kernels only read it.
#pragma once

#include <cstdint>

#include "common.h"
#include "dtype.h"

namespace avo {

// Inputs whose layout needs more dimensions (after merging) are made contiguous first.
constexpr int kMaxDims = 8;

template <int NumInputs, int NumOutputs>
struct MapArgs {
  const void* inputs[NumInputs];  // nullptr for a missing optional input
  void* outputs[NumOutputs];      // contiguous, in the broadcast shape
  int64_t numel;                  // elements of the broadcast shape
  // The broadcast shape, right-aligned in kMaxDims slots: sizes[kMaxDims - ndim ...].
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t input_strides[NumInputs][kMaxDims];  // in elements; 0 along broadcast dims
  // True when every present input is laid out exactly like the outputs (dense,
  // row-major, unbroadcast): element i of every tensor is at offset i.
  bool contiguous;
};

// Offsets (in elements) of every input's element for output element `linear`.
template <int NumInputs, int NumOutputs>
AVO_HOST_DEVICE void input_offsets(const MapArgs<NumInputs, NumOutputs>& args, int64_t linear,
                                   int64_t (&offsets)[NumInputs]) {
AVO_UNROLL
  for (int k = 0; k < NumInputs; ++k) offsets[k] = 0;
AVO_UNROLL
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < kMaxDims - args.ndim) break;
    const int64_t coordinate = linear % args.sizes[d];
    linear /= args.sizes[d];
AVO_UNROLL
    for (int k = 0; k < NumInputs; ++k) offsets[k] += coordinate * args.input_strides[k][d];
  }
}

// True when input k of the call is there: always, unless Math marks it optional.
template <typename Math, int NumInputs, int NumOutputs>
AVO_HOST_DEVICE bool input_present(const MapArgs<NumInputs, NumOutputs>& args, int k) {
  return !((Math::kOptionalInputs >> k) & 1u) || args.inputs[k] != nullptr;
}

// One element of a map op: the element of each input as float (Math::missing(k) for an
// absent optional input), the math, and the outputs in T. `load(k)` reads input k's
// element; it is only called for inputs that are present.
template <typename Precision, typename T, int NumInputs, int NumOutputs, typename Math, typename Load>
AVO_HOST_DEVICE void map_element(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, Load load,
                                 T (&out)[NumOutputs]) {
  float in_f[NumInputs];
  float out_f[NumOutputs];
AVO_UNROLL
  for (int k = 0; k < NumInputs; ++k)
    in_f[k] = input_present<Math>(args, k) ? Element<T>::to_float(load(k)) : Math::missing(k);
  math.template apply<Precision>(in_f, out_f);
AVO_UNROLL
  for (int k = 0; k < NumOutputs; ++k) out[k] = Element<T>::from_float(out_f[k]);
}

}  // namespace avo
