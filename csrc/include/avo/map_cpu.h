// The CPU loop of every elementwise ("map") op; the generated math is what differs.
#pragma once

#include <cstdint>

#include "cpu_copies.h"
#include "map_args.h"
#include "math.h"

namespace avo {

// Output elements [begin, end), in the math precision of T (avo/math.h): a plain loop
// when every input is laid out like the output, the strided walk otherwise.
template <typename T, int NumInputs, int NumOutputs, typename Math>
struct MapKernel {
  static void run(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, int64_t begin, int64_t end) {
    T out[NumOutputs];
    if (args.contiguous) {
      // The tensors' pointers in locals, which the loop's stores cannot change: it then
      // vectorizes without reloading them.
      const T* inputs[NumInputs];
      T* outputs[NumOutputs];
      for (int k = 0; k < NumInputs; ++k) inputs[k] = static_cast<const T*>(args.inputs[k]);
      for (int k = 0; k < NumOutputs; ++k) outputs[k] = static_cast<T*>(args.outputs[k]);
      for (int64_t i = begin; i < end; ++i) {
        map_element<PrecisionFor<T>>(args, math, [&](int k) { return inputs[k][i]; }, out);
        for (int k = 0; k < NumOutputs; ++k) outputs[k][i] = out[k];
      }
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      int64_t offsets[NumInputs];
      input_offsets(args, i, offsets);
      map_element<PrecisionFor<T>>(args, math, [&](int k) { return static_cast<const T*>(args.inputs[k])[offsets[k]]; }, out);
      for (int k = 0; k < NumOutputs; ++k) static_cast<T*>(args.outputs[k])[i] = out[k];
    }
  }
};
template <typename T, int NumInputs, int NumOutputs, typename Math>
void run_map(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, int64_t begin, int64_t end) {
  run_cpu_copy<MapKernel<T, NumInputs, NumOutputs, Math>>(args, math, begin, end);
}

}  // namespace avo
