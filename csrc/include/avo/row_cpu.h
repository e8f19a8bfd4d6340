// One row of a row kernel on the CPU: plain sequential loops. Sums accumulate in double
// (cheap here, and exact enough for rows of any length).
#pragma once

#include <cmath>
#include <limits>

#include "math.h"
#include "row_args.h"

namespace avo {

template <typename T, typename Args>
struct SerialRow : RowView<T, Args> {
  using RowView<T, Args>::RowView;
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;

  template <typename F>
  float sum(F term) const {
    double total = 0.0;
    for (int64_t n = 0; n < args.length; ++n) total += term(n);
    return float(total);
  }
  template <typename F>
  float max(F term) const {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < args.length; ++n) best = Functions<Exact>::maximum(best, term(n));
    return best;
  }
  template <typename F>
  float min(F term) const {
    float best = std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < args.length; ++n) best = Functions<Exact>::minimum(best, term(n));
    return best;
  }
  template <typename F>
  void for_each(F body) const {
    for (int64_t n = 0; n < args.length; ++n) body(n);
  }
  void store_row(int k, float value) const { static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value); }
  // A per-row value kept in fp32 (output k is a float buffer of one value per row).
  void store_row_f32(int k, float value) const {
    if (args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }
  void save(int j, float value) const {
    if (args.saved != nullptr) args.saved[r * args.saved_per_row + j] = value;
  }
};

}  // namespace avo
