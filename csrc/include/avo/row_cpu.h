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

  // Element n of the row, as the generated lambdas see it.
  struct At {
    const SerialRow& row;
    int64_t n;
    float load(int k) const { return row.load(k, n); }
    float load_col(int k, float missing) const { return row.load_col(k, n, missing); }
    void store(int k, float value) const { row.store(k, n, value); }
    // Kept values (see generator/emit_row.py) are computed again in every pass here.
    template <typename F>
    float keep(int, F value) const { return value(); }
    template <typename F>
    float kept(int, F value) const { return value(); }
  };

  // Every pass takes the per-column inputs it reads (Columns, row_args.h) first; the
  // CPU reads them element by element and needs no list.
  template <unsigned M, typename F>
  float sum(Columns<M>, F term) const {
    double total = 0.0;
    for (int64_t n = 0; n < args.length; ++n) total += term(At{*this, n});
    return float(total);
  }
  // Several sums in one pass: out[k] = the sum of terms[k] over the row.
  template <unsigned M, int K, typename F>
  void sums(Columns<M>, float (&out)[K], F terms_at) const {
    double total[K] = {};
    for (int64_t n = 0; n < args.length; ++n) {
      float terms[K];
      terms_at(At{*this, n}, terms);
      for (int k = 0; k < K; ++k) total[k] += terms[k];
    }
    for (int k = 0; k < K; ++k) out[k] = float(total[k]);
  }
  // The sum of term over the row (out[0]) and the sum of the squares of its deviations
  // from their mean (out[1]): two passes, in double.
  template <unsigned M, typename F>
  void moments(Columns<M>, float (&out)[2], F term) const {
    double total = 0.0, squares = 0.0;
    for (int64_t n = 0; n < args.length; ++n) total += term(At{*this, n});
    const double mean = args.length > 0 ? total / double(args.length) : 0.0;
    for (int64_t n = 0; n < args.length; ++n) {
      const double d = double(term(At{*this, n})) - mean;
      squares += d * d;
    }
    out[0] = float(total);
    out[1] = float(squares);
  }
  // The sum of the squares of term, in double.
  template <unsigned M, typename F>
  float sum_squares(Columns<M>, F term) const {
    double total = 0.0;
    for (int64_t n = 0; n < args.length; ++n) {
      const double t = term(At{*this, n});
      total += t * t;
    }
    return float(total);
  }
  template <unsigned M, typename F>
  float max(Columns<M>, F term) const {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < args.length; ++n) best = Functions<Exact>::maximum(best, term(At{*this, n}));
    return best;
  }
  template <unsigned M, typename F>
  float min(Columns<M>, F term) const {
    float best = std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < args.length; ++n) best = Functions<Exact>::minimum(best, term(At{*this, n}));
    return best;
  }
  template <unsigned M, typename F>
  void for_each(Columns<M>, F body) const {
    for (int64_t n = 0; n < args.length; ++n) body(At{*this, n});
  }
  // for_each whose body also yields the K per-column terms of its element, added to the
  // partial sums of this row's chunk (fp32, rows in order); the chunk's first row sets
  // them (the partials start uninitialised).
  template <int K, unsigned M, typename F>
  void for_each_with_column_sums(Columns<M>, F body) const {
    const int64_t chunk = args.partials != nullptr ? r / args.rows_per_chunk : -1;
    const bool first = args.partials != nullptr && r % args.rows_per_chunk == 0;
    for (int64_t n = 0; n < args.length; ++n) {
      float terms[K];
      body(At{*this, n}, terms);
      if (chunk < 0) continue;
      for (int k = 0; k < K; ++k) {
        float& partial = args.partials[(k * args.chunks + chunk) * args.length + n];
        partial = first ? terms[k] : partial + terms[k];
      }
    }
  }
  void store_row(int k, float value) const { static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value); }
  // A per-row value kept in fp32 (output k is a float buffer of one value per row).
  void store_row_f32(int k, float value) const {
    if (args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }
};

}  // namespace avo

namespace avo {

// The CPU loops of every row op; the generated math is what differs between ops.

// Rows [begin, end), in order.
template <typename T, typename Args, typename Math>
void run_rows(const Args& args, const Math& math, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) math.template apply<Exact>(SerialRow<T, Args>(args, r));
}

// Column totals (avo/row_args.h), columns [begin, end): each source's rows added in order.
template <typename T>
void run_column_totals(const ColumnTotals& totals, int64_t begin, int64_t end) {
  for (int k = 0; k < totals.count; ++k) {
    T* out = static_cast<T*>(totals.targets[k]);
    if (out == nullptr) continue;
    for (int64_t n = begin; n < end; ++n) {
      float total = 0.0f;
      for (int64_t r = 0; r < totals.rows; ++r) total += totals.sources[k][r * totals.length + n];
      out[n] = Element<T>::from_float(total);
    }
  }
}

// Per-column outputs, columns [begin, end): the chunks' partials summed in chunk order.
template <typename T, typename Args, typename Math>
void run_column_finish(const Args& args, int64_t begin, int64_t end) {
  run_column_totals<T>(column_totals<Math>(args, args.chunks), begin, end);
}

}  // namespace avo
