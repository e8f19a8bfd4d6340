// One row of a row kernel on the CPU: loops over the row's elements that the compiler
// vectorizes. Sums accumulate in double (cheap here, and exact enough for rows of any
// length), in kSumLanes running sums (below).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common.h"
#include "cpu_copies.h"
#include "math.h"
#include "row_args.h"

namespace avo {

// Every reduction over a row keeps kSumLanes running values, element n going to lane
// n % kSumLanes, and combines them in a fixed order at the end: independent additions
// that the CPU overlaps and vectorizes (a single running sum waits for each addition in
// turn). The order depends on the row length alone, so results are the same on every
// machine, instruction set and thread count.
constexpr int kSumLanes = 8;

// out[k] = the reduction of the values v[k] that values(n, v) sets for n in [0, length),
// each added to a running value by combine(running, value) (in place): element n goes to
// lane n % kSumLanes, the lanes are combined pairwise in a fixed order at the end. Blocks
// of kSumBlock elements are computed first and added to the lanes after: the loop that
// computes them then vectorizes (math and all), where one that adds each value as it
// comes would not. The lanes are one vector of GCC's vector extension, which `combine`
// takes as well as single values (a generic lambda, by reference: GCC warns that a vector
// wider than the registers is passed by value differently by each instruction set): a
// block goes to them in one vector addition per kSumLanes values, in every kernel. As
// eight separate values the compiler vectorized them in some kernels and not in others,
// as the rest of the function varied (swish_layernorm's bf16 forward ran 1.3x slower).
constexpr int kSumBlock = 64;
template <typename V>
struct SumLanes {
  typedef V type __attribute__((vector_size(kSumLanes * sizeof(V))));
};
template <int K, typename V, typename Combine, typename Values>
inline void lane_reduce(int64_t length, V start, Combine combine, Values values, V (&out)[K]) {
  static_assert(kSumBlock % kSumLanes == 0, "a block fills every lane alike");
  using Lanes = typename SumLanes<V>::type;
  Lanes lanes[K];
  for (int k = 0; k < K; ++k)
    for (int l = 0; l < kSumLanes; ++l) lanes[k][l] = start;
  int64_t n = 0;
  for (; n + kSumBlock <= length; n += kSumBlock) {
    V block[K][kSumBlock];
    for (int j = 0; j < kSumBlock; ++j) {
      V v[K];
      values(n + j, v);
      for (int k = 0; k < K; ++k) block[k][j] = v[k];
    }
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < kSumBlock; j += kSumLanes) {
        Lanes b;
        std::memcpy(&b, &block[k][j], sizeof b);
        combine(lanes[k], b);
      }
  }
  V each[K][kSumLanes];
  std::memcpy(each, lanes, sizeof each);
  for (; n < length; ++n) {
    V v[K];
    values(n, v);
    for (int k = 0; k < K; ++k) combine(each[k][n % kSumLanes], v[k]);
  }
  for (int k = 0; k < K; ++k) {
    for (int width = kSumLanes / 2; width > 0; width /= 2)
      for (int l = 0; l < width; ++l) combine(each[k][l], each[k][l + width]);
    out[k] = each[k][0];
  }
}

// The same for one value an element: value(n) returns it.
template <typename V, typename Combine, typename Value>
inline V lane_reduce(int64_t length, V start, Combine combine, Value value) {
  V out[1];
  lane_reduce(length, start, combine, [&](int64_t n, V (&v)[1]) { v[0] = value(n); }, out);
  return out[0];
}

// The maximum (kMaximum) or the minimum of value(n) over [0, length), NaN propagating as
// Functions<Exact>::maximum and minimum do, in lane_reduce's lanes and order. The lanes
// are one vector of GCC's vector extension, whose comparison and select the compiler
// makes one max or min instruction (as separate floats, with or without the NaN test, the
// lanes stayed scalar), and take the plain comparison; the blocks note whether they held
// a NaN. A row with one is reduced again the NaN-propagating way, so that it gives the
// same NaN as that always did.
template <bool kMaximum, typename Value>
inline float lane_extreme(int64_t length, Value value) {
  using Lanes = float __attribute__((vector_size(kSumLanes * sizeof(float))));
  constexpr float kStart = kMaximum ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  const auto plain = [](float a, float b) { return (kMaximum ? a > b : a < b) ? a : b; };
  Lanes lanes;
  for (int l = 0; l < kSumLanes; ++l) lanes[l] = kStart;
  bool saw_nan = false;
  int64_t n = 0;
  for (; n + kSumBlock <= length; n += kSumBlock) {
    float block[kSumBlock];
    int nans = 0;
    for (int j = 0; j < kSumBlock; ++j) {
      block[j] = value(n + j);
      nans |= block[j] != block[j];
    }
    saw_nan |= nans != 0;
    for (int j = 0; j < kSumBlock; j += kSumLanes) {
      Lanes b;
      std::memcpy(&b, block + j, sizeof b);
      lanes = kMaximum ? (lanes > b ? lanes : b) : (lanes < b ? lanes : b);
    }
  }
  float out[kSumLanes];
  std::memcpy(out, &lanes, sizeof out);
  for (; n < length; ++n) {
    const float v = value(n);
    saw_nan |= v != v;
    out[n % kSumLanes] = plain(out[n % kSumLanes], v);
  }
  if (saw_nan) {
    // Functions<Exact>::maximum and minimum, on single values and on vectors of them.
    return lane_reduce(length, kStart, [](auto& a, const auto& b) {
      a = ((a != a) | (kMaximum ? a > b : a < b)) ? a : b;
    }, value);
  }
  for (int width = kSumLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) out[l] = plain(out[l], out[l + width]);
  return out[0];
}

// Float16 rows in the copies that convert with F16C (converts_halves_in_hardware):
// RowsKernel converts a row's per-element inputs to floats before its math and its
// per-element outputs after it, a whole row at a time, and the per-column inputs once
// for all its rows; a staged SerialRow reads and writes those floats instead of
// converting each element.
template <int NumInputs, int NumOutputs>
struct StagedFloats {
  const float* inputs[NumInputs];  // per-element and per-column inputs the call gave, else nullptr
  float* outputs[NumOutputs];      // per-element outputs, else nullptr
};

template <typename T, typename Args, typename Math, bool kStaged = false>
struct SerialRow : RowView<T, Args> {
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;
  using Staged = StagedFloats<Args::kInputs, Args::kOutputs>;
  // Rows of the scratch: kept value i (at.keep / at.kept) in row i, then host-kept value
  // i (at.keep_on_host / at.kept_on_host) in row kept_values + i; the last one, moments'
  // terms. Known when compiling, as are the offsets of the rows.
  static constexpr int kept_values = Math::kKeptValues;
  static constexpr int scratch_rows = Math::kKeptValues + Math::kHostKeptValues + 1;
  // This worker's scratch rows of `length` floats each (run_rows).
  float* scratch;
  // The row's floats where kStaged (RowsKernel::run_staged), else nullptr.
  const Staged* staged;

  SerialRow(const Args& a, int64_t row, float* worker_scratch, const Staged* staged_floats = nullptr)
      : RowView<T, Args>(a, row), scratch(worker_scratch), staged(staged_floats) {}

  float load(int k, int64_t n) const {
    if constexpr (kStaged) return staged->inputs[k][n];
    else return RowView<T, Args>::load(k, n);
  }
  void store(int k, int64_t n, float value) const {
    if constexpr (kStaged) staged->outputs[k][n] = value;
    else RowView<T, Args>::store(k, n, value);
  }
  // RowView::as_stored's value; float16's from Element<Half>::round, the same bits in a
  // few vector instructions instead of the two conversions.
  float as_stored(float value) const {
    if constexpr (std::is_same_v<T, Half>) return Element<Half>::round(value);
    else return RowView<T, Args>::as_stored(value);
  }

  // Element n of the row, as the generated lambdas see it.
  struct At {
    const SerialRow& row;
    int64_t n;
    float load(int k) const { return row.load(k, n); }
    // Every per-column input is present here: run_rows hands a missing one in as a row of
    // its default (exact in T: the generator checks the spec's). A 16-bit load behind a
    // pointer test vectorizes only where the instruction set masks loads (AVX-512).
    float load_col(int k, float) const {
      if constexpr (kStaged) return row.staged->inputs[k][n];
      else return Element<T>::to_float(static_cast<const T*>(row.args.inputs[k])[n]);
    }
    void store(int k, float value) const { row.store(k, n, value); }
    // A kept value is computed in the pass that keeps it and read back from the scratch
    // row in the later ones (see generator/emit_row.py).
    template <typename F>
    float keep(int i, F value) const {
      const float v = value();
      row.scratch[i * row.args.length + n] = v;
      return v;
    }
    template <typename F>
    float kept(int i, F) const { return row.scratch[i * row.args.length + n]; }
    // The CPU keeps host-kept values the same way, in the scratch rows after the kept ones.
    template <typename F>
    float keep_on_host(int i, F value) const { return keep(row.kept_values + i, value); }
    template <typename F>
    float kept_on_host(int i, F value) const { return kept(row.kept_values + i, value); }
  };
  At at(int64_t n) const { return At{*this, n}; }

  // Every pass takes the per-column inputs it reads (Columns, row_args.h) first; the
  // CPU reads them element by element and needs no list.
  template <unsigned M, typename F>
  float sum(Columns<M>, F term) const {
    return float(lane_reduce(args.length, 0.0, add_to, [&](int64_t n) { return double(term(at(n))); }));
  }
  // Several sums in one pass: out[k] = the sum of terms[k] over the row.
  template <unsigned M, int K, typename F>
  void sums(Columns<M>, float (&out)[K], F terms_at) const {
    double total[K];
    lane_reduce(args.length, 0.0, add_to,
                [&](int64_t n, double (&v)[K]) {
                  float terms[K];
                  terms_at(at(n), terms);
                  for (int k = 0; k < K; ++k) v[k] = terms[k];
                },
                total);
    for (int k = 0; k < K; ++k) out[k] = float(total[k]);
  }
  // The sum of term over the row (out[0]) and the sum of the squares of its deviations
  // from their mean (out[1]): two passes in double, the second over the terms the first
  // left in the last scratch row.
  template <unsigned M, typename F>
  void moments(Columns<M>, float (&out)[2], F term) const {
    float* terms = scratch + int64_t(scratch_rows - 1) * args.length;
    const double total = lane_reduce(args.length, 0.0, add_to, [&](int64_t n) {
      terms[n] = term(at(n));
      return double(terms[n]);
    });
    const double mean = args.length > 0 ? total / double(args.length) : 0.0;
    const double squares = lane_reduce(args.length, 0.0, add_to, [&](int64_t n) {
      const double d = double(terms[n]) - mean;
      return d * d;
    });
    out[0] = float(total);
    out[1] = float(squares);
  }
  // The sum of the squares of term, in double.
  template <unsigned M, typename F>
  float sum_squares(Columns<M>, F term) const {
    return float(lane_reduce(args.length, 0.0, add_to, [&](int64_t n) {
      const double t = term(at(n));
      return t * t;
    }));
  }
  template <unsigned M, typename F>
  float max(Columns<M>, F term) const {
    return lane_extreme<true>(args.length, [&](int64_t n) { return term(at(n)); });
  }
  template <unsigned M, typename F>
  float min(Columns<M>, F term) const {
    return lane_extreme<false>(args.length, [&](int64_t n) { return term(at(n)); });
  }
  template <unsigned M, typename F>
  void for_each(Columns<M>, F body) const {
    for (int64_t n = 0; n < args.length; ++n) body(at(n));
  }
  // for_each whose body also yields the K per-column terms of its element, added to the
  // partial sums of this row's chunk (fp32, rows in order); the chunk's first row sets
  // them (the partials start uninitialised).
  template <int K, unsigned M, typename F>
  void for_each_with_column_sums(Columns<M>, F body) const {
    if (args.partials == nullptr) {
      float terms[K];
      for (int64_t n = 0; n < args.length; ++n) body(at(n), terms);
      return;
    }
    const int64_t chunk = r / args.rows_per_chunk;
    const bool first = r % args.rows_per_chunk == 0;
    float* partials[K];
    for (int k = 0; k < K; ++k) partials[k] = args.partials + (k * args.chunks + chunk) * args.length;
    for (int64_t n = 0; n < args.length; ++n) {
      float terms[K];
      body(at(n), terms);
      for (int k = 0; k < K; ++k) partials[k][n] = first ? terms[k] : partials[k][n] + terms[k];
    }
  }
  void store_row(int k, float value) const { static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value); }
  // A per-row value kept in fp32 (output k is a float buffer of one value per row).
  void store_row_f32(int k, float value) const {
    if (args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }

 private:
  // On single values and on lane_reduce's vectors of them.
  static constexpr auto add_to = [](auto& sum, const auto& value) { sum += value; };
};

}  // namespace avo

namespace avo {

// The CPU loops of every row op; the generated math is what differs between ops.

// Rows [begin, end), in order, in the math precision of T (avo/math.h); float16 rows
// staged in floats where copy C converts them with F16C (StagedFloats).
template <typename T, typename Args, typename Math>
struct RowsKernel {
  template <CpuCopy C>
  static void run(const Args& args, const Math& math, int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, Half> && converts_halves_in_hardware(C)) {
      run_staged(args, math, begin, end);
    } else {
      using Row = SerialRow<T, Args, Math>;
      std::vector<float> scratch(size_t(Row::scratch_rows) * size_t(args.length));
      for (int64_t r = begin; r < end; ++r) math.template apply<PrecisionFor<T>>(Row(args, r, scratch.data()));
    }
  }

  static void run_staged(const Args& args, const Math& math, int64_t begin, int64_t end) {
    using Row = SerialRow<T, Args, Math, true>;
    constexpr int kInputs = Args::kInputs, kOutputs = Args::kOutputs;
    const int64_t length = args.length;
    std::vector<float> scratch(size_t(Row::scratch_rows) * size_t(length));
    std::vector<float> floats(size_t(kInputs + kOutputs) * size_t(length));
    const auto input_floats = [&](int k) { return floats.data() + k * length; };
    const auto output_floats = [&](int k) { return floats.data() + (kInputs + k) * length; };
    const auto is_element_input = [&](int k) { return ((Math::kElementInputs >> k) & 1u) && args.inputs[k] != nullptr; };
    typename Row::Staged staged{};
    for (int k = 0; k < kInputs; ++k) {
      if (is_element_input(k)) staged.inputs[k] = input_floats(k);
      if (((Math::kColumnInputs >> k) & 1u) && args.inputs[k] != nullptr) {
        halves_to_floats(static_cast<const Half*>(args.inputs[k]), input_floats(k), length);
        staged.inputs[k] = input_floats(k);
      }
    }
    for (int k = 0; k < kOutputs; ++k)
      if ((Math::kElementOutputs >> k) & 1u) staged.outputs[k] = output_floats(k);
    for (int64_t r = begin; r < end; ++r) {
      for (int k = 0; k < kInputs; ++k)
        if (is_element_input(k)) halves_to_floats(static_cast<const Half*>(args.inputs[k]) + r * length, input_floats(k), length);
      math.template apply<PrecisionFor<T>>(Row(args, r, scratch.data(), &staged));
      for (int k = 0; k < kOutputs; ++k)
        if (staged.outputs[k] != nullptr && args.outputs[k] != nullptr)
          floats_to_halves(output_floats(k), static_cast<Half*>(args.outputs[k]) + r * length, length);
    }
  }
};
// A per-column input the call left out is read from a row of Math::column_default(k) in
// T, this worker's (as the GPU rows fill a vector with it): every pass then loads weight
// and bias the same way, whether the call gave them or not (SerialRow::At::load_col).
// Filled here, outside the kernel's copies, which take the arguments by reference.
template <typename T, typename Args, typename Math>
void run_rows(const Args& args, const Math& math, int64_t begin, int64_t end) {
  const auto left_out = [&](int k) { return ((Math::kColumnInputs >> k) & 1u) && args.inputs[k] == nullptr; };
  int missing = 0;
  for (int k = 0; k < Args::kInputs; ++k) missing += left_out(k);
  std::vector<T> defaults(size_t(missing) * size_t(args.length));
  Args given = args;
  T* next = defaults.data();
  for (int k = 0; k < Args::kInputs; ++k) {
    if (!left_out(k)) continue;
    std::fill(next, next + args.length, Element<T>::from_float(Math::column_default(k)));
    given.inputs[k] = next;
    next += args.length;
  }
  run_cpu_copy<RowsKernel<T, Args, Math>>(given, math, begin, end);
}

// Column totals (avo/row_args.h), columns [begin, end): each source's rows added in order.
template <typename T>
struct ColumnTotalsKernel {
  template <CpuCopy>
  static void run(const ColumnTotals& totals, int64_t begin, int64_t end) {
    std::vector<float> column(size_t(end > begin ? end - begin : 0));
    for (int k = 0; k < totals.count; ++k) {
      T* out = static_cast<T*>(totals.targets[k]);
      if (out == nullptr) continue;
      for (float& total : column) total = 0.0f;
      for (int64_t r = 0; r < totals.rows; ++r) {
        const float* source = totals.sources[k] + r * totals.length;
        for (int64_t n = begin; n < end; ++n) column[n - begin] += source[n];
      }
      for (int64_t n = begin; n < end; ++n) out[n] = Element<T>::from_float(column[n - begin]);
    }
  }
};
template <typename T>
void run_column_totals(const ColumnTotals& totals, int64_t begin, int64_t end) {
  run_cpu_copy<ColumnTotalsKernel<T>>(totals, begin, end);
}

// Per-column outputs, columns [begin, end): the chunks' partials summed in chunk order.
template <typename T, typename Args, typename Math>
void run_column_finish(const Args& args, int64_t begin, int64_t end) {
  run_column_totals<T>(column_totals<Math>(args, args.chunks), begin, end);
}

}  // namespace avo
