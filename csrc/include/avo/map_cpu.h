// The CPU loop of every elementwise ("map") op; the generated math is what differs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu_copies.h"
#include "map_args.h"
#include "math.h"

namespace avo {

// Output elements [begin, end), in the math precision of T (avo/math.h): a plain loop
// when every input is laid out like the output (float16 staged in floats where copy C
// converts them with F16C, run_staged), the strided walk otherwise.
template <typename T, int NumInputs, int NumOutputs, typename Math>
struct MapKernel {
  template <CpuCopy C>
  static void run(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, int64_t begin, int64_t end) {
    T out[NumOutputs];
    if constexpr (std::is_same_v<T, Half> && converts_halves_in_hardware(C)) {
      if (args.contiguous) return run_staged(args, math, begin, end);
    }
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

  // Contiguous float16 elements in the copies with F16C: blocks of kBlock converted to
  // floats, the math on them, the outputs converted back (as RowsKernel's staged rows).
  static constexpr int64_t kBlock = 512;
  static void run_staged(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, int64_t begin, int64_t end) {
    float inputs[NumInputs][kBlock];
    float outputs[NumOutputs][kBlock];
    for (int64_t first = begin; first < end; first += kBlock) {
      const int64_t count = end - first < kBlock ? end - first : kBlock;
      for (int k = 0; k < NumInputs; ++k)
        if (input_present<Math>(args, k)) halves_to_floats(static_cast<const Half*>(args.inputs[k]) + first, inputs[k], count);
      for (int64_t j = 0; j < count; ++j) {
        float out[NumOutputs];
        map_element<PrecisionFor<T>>(args, math, [&](int k) { return inputs[k][j]; }, out);
        for (int k = 0; k < NumOutputs; ++k) outputs[k][j] = out[k];
      }
      for (int k = 0; k < NumOutputs; ++k) floats_to_halves(outputs[k], static_cast<Half*>(args.outputs[k]) + first, count);
    }
  }
};
template <typename T, int NumInputs, int NumOutputs, typename Math>
void run_map(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, int64_t begin, int64_t end) {
  run_cpu_copy<MapKernel<T, NumInputs, NumOutputs, Math>>(args, math, begin, end);
}

}  // namespace avo
