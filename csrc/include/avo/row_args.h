// Arguments of a "row" kernel (a reduction over the last dimension, then a map): the
// tensors seen as rows of `length` elements, and the views the generated math reads
// them through. No torch headers (DESIGN.md).
#pragma once

#include <cstdint>

#include "common.h"
#include "dtype.h"

namespace avo {

// Rows of at least this many elements are "long": their parameter gradients take fewer,
// larger chunks (rows_per_chunk).
constexpr int64_t kLongRow = 32768;

// Chunks of the per-column sums, each one worker's (a GPU block's, group's or cluster's)
// rows: kRowsPerChunk rows each (the partials then add 1/kRowsPerChunk of the rows' size
// in fp32), fewer when that would leave under kMinChunks chunks (a few rows: 8 chunks of
// 32 rows would keep 8 blocks busy on a GPU of 132 multiprocessors), more when it would
// make over kMaxChunks. Rows of kLongRow elements or more need fewer chunks to fill the
// GPU (a chunk's worker is a cluster of up to 16 blocks on sm_90) and cost more per
// chunk: at least kMinLongRowChunks. With a chunk per row, layernorm's backward at
// 256x262144 wrote and re-read 512 MiB of partials for 384 MiB of rows. `coarse`: at
// least kMinCoarseChunks instead of kMinChunks, which some GPU backwards are faster with
// (the dispatch table's coarse_chunks line, avo/row_version.h; rmsnorm's 16-bit backward
// at 4096x16384 1.13x on the H200). The binding sizes the partials for the finer chunks,
// never fewer than the coarse ones. The chunks fix the order of the sums: the result
// depends on the shape and, on the GPU, on its table.
constexpr int64_t kRowsPerChunk = 32;
constexpr int64_t kMinChunks = 256;
constexpr int64_t kMinCoarseChunks = 128;
constexpr int64_t kMaxChunks = 4096;
constexpr int64_t kMinLongRowChunks = 64;

inline int64_t rows_per_chunk(int64_t rows, int64_t length, bool coarse = false) {
  const int64_t min_chunks = length >= kLongRow ? kMinLongRowChunks : coarse ? kMinCoarseChunks : kMinChunks;
  int64_t spread = (rows + min_chunks - 1) / min_chunks;
  if (spread < 1) spread = 1;
  if (spread > kRowsPerChunk) spread = kRowsPerChunk;
  const int64_t fewest = (rows + kMaxChunks - 1) / kMaxChunks;
  return spread > fewest ? spread : fewest;
}

// Sets args.rows_per_chunk and args.chunks by rows_per_chunk (the binding, fine chunks;
// the GPU launch again where its table takes coarse ones).
template <typename Args>
void chunk_rows(Args& args, bool coarse = false) {
  args.rows_per_chunk = rows_per_chunk(args.rows, args.length, coarse);
  args.chunks = (args.rows + args.rows_per_chunk - 1) / args.rows_per_chunk;
}

// The tiled version of the GPU backwards with per-column sums (row_cuda.cuh) cuts a row
// of 16-byte vectors into tiles of kTileThreads * kTileVectors vectors, one block each.
// Its first kernel writes each tile's part of the row's reduction: [rows,
// kTiledMaxSums, row_tiles] floats, after the partials in the same allocation (the
// binding adds them where a row has two tiles or more). Its second kernel takes a tile
// of a chunk of tiled_rows_per_chunk rows, about kTiledBlocks (tile, chunk) pairs in
// all: the tiles give the parallelism, so a chunk holds more rows than the other
// versions' (fewer partials).
constexpr int kTileThreads = 256;
constexpr int kTileVectors = 2;
constexpr int kTiledMaxSums = 4;
constexpr int64_t kTiledBlocks = 1024;
AVO_HOST_DEVICE int64_t row_tiles(int64_t length, int64_t element_bytes) {
  const int64_t per_vector = 16 / element_bytes;
  constexpr int64_t tile = int64_t(kTileThreads) * kTileVectors;
  return length % per_vector == 0 ? (length / per_vector + tile - 1) / tile : 0;
}
// The rows a chunk when `wanted` chunks are asked for, at most `chunks` (the partials the
// binding made room for) and `rows`.
AVO_HOST_DEVICE int64_t rows_per_wanted_chunk(int64_t rows, int64_t wanted, int64_t chunks) {
  if (wanted > chunks) wanted = chunks;
  if (wanted > rows) wanted = rows;
  return wanted > 0 ? (rows + wanted - 1) / wanted : 1;
}
AVO_HOST_DEVICE int64_t tiled_rows_per_chunk(int64_t rows, int64_t tiles, int64_t chunks) {
  return rows_per_wanted_chunk(rows, (kTiledBlocks + tiles - 1) / tiles, chunks);
}
// The tiled version in one kernel runs its blocks all at once, a tile of a chunk each:
// about 128 multiprocessors' worth (an H100 or H200 has 132), at the kernel's blocks a
// multiprocessor (two or three, by the op: kOneKernelTiledBlocksPerMultiprocessor in
// avo/row_cuda.cuh), so 128 * blocks_per_multiprocessor / tiles chunks of rows (fewer
// where the rows or the partials are fewer). A number fixed by the op and the shape, not
// the GPU: the chunks fix the order of the per-column sums.
constexpr int64_t kOneKernelTiledMultiprocessors = 128;
AVO_HOST_DEVICE int64_t one_kernel_tiled_rows_per_chunk(int64_t rows, int64_t tiles, int64_t chunks,
                                                       int blocks_per_multiprocessor) {
  const int64_t wanted = kOneKernelTiledMultiprocessors * blocks_per_multiprocessor / tiles;
  return rows_per_wanted_chunk(rows, wanted > 1 ? wanted : 1, chunks);
}
// The floats the tiled version takes after the partials, for its tile sums: in two
// kernels [rows, kTiledMaxSums, tiles] floats, in one as many 64-bit words (a part and
// the mark that it is written), which the launch clears.
AVO_HOST_DEVICE int64_t tiled_scratch_floats(int64_t rows, int64_t tiles) {
  return 2 * rows * kTiledMaxSums * tiles;
}
AVO_HOST_DEVICE int64_t tiled_one_kernel_part_bytes(int64_t rows, int64_t tiles) {
  return rows * kTiledMaxSums * tiles * 8;
}

template <int NumInputs, int NumOutputs>
struct RowArgs {
  static constexpr int kInputs = NumInputs;
  static constexpr int kOutputs = NumOutputs;
  // Per-element tensors are dense [rows, length]; per-column ones [length]; per-row ones
  // [rows]. A missing optional input is nullptr; so is an output nobody asked for.
  const void* inputs[NumInputs];
  void* outputs[NumOutputs];
  int64_t rows;
  int64_t length;
  int64_t channels;  // channel ops ([B, C, *S]): C, and row r is channel r % C; else 0
  // Backward with per-column outputs only: fp32 partial sums [column sums, chunks, length],
  // one per chunk of `rows_per_chunk` consecutive rows (set by the kernels), later summed
  // over the chunks in order. A chunk is processed by one worker, its rows in order, so
  // the result is deterministic.
  float* partials;
  int64_t chunks;
  int64_t rows_per_chunk;
  // The tiled version's tile sums (see row_tiles), or nullptr where the call has none.
  float* tile_sums;
  // GPU cluster rows with per-column sums: whether they ask L2 for the rows of their
  // chunk ahead of their loads (cluster_rows; set by launch_row_op).
  bool prefetch_rows;
};

// Column totals of fp32 tables: target k ([length], in the op's dtype) is the sum of
// sources[k] ([rows, length], fp32) over its rows, in an order fixed by the shape (the
// result does not depend on the machine). Two things are finished this way: the
// per-column outputs of a backward (the sources are its chunks' partials, a row per
// chunk: column_totals) and the per-channel outputs of a channel op (one fp32 value per
// row of [batch, channels], summed over the batch: csrc/row_binding.h, channel_totals).
constexpr int kMaxColumnTotals = 4;
struct ColumnTotals {
  const float* sources[kMaxColumnTotals];
  void* targets[kMaxColumnTotals];  // nullptr: an output nobody asked for
  int count;
  int64_t rows;
  int64_t length;
};

// The per-column outputs of a backward as column totals of the partials of its first
// `chunks` chunks (args.chunks, or the GPU tiled version's fewer).
template <typename Math, typename Args>
ColumnTotals column_totals(const Args& args, int64_t chunks) {
  static_assert(Math::kColumnSums <= kMaxColumnTotals, "more per-column outputs than ColumnTotals holds");
  ColumnTotals totals{};
  totals.count = Math::kColumnSums;
  totals.rows = chunks;
  totals.length = args.length;
  for (int k = 0; k < Math::kColumnSums; ++k) {
    totals.sources[k] = args.partials + k * chunks * args.length;
    totals.targets[k] = args.outputs[Math::column_output(k)];
  }
  return totals;
}

// The per-column inputs (weight, bias) that one pass over a row reads, bit k for input
// k. The generated math hands one to every pass, `row.for_each(avo::columns<1, 2>, body)`,
// so that a GPU row loads exactly those inputs, a 16-byte vector at a time, in that pass
// and in no other (the CPU row reads elements and ignores it).
template <unsigned Mask>
struct Columns {
  static constexpr unsigned kMask = Mask;
};
template <int... K>
inline constexpr Columns<(0u | ... | (1u << K))> columns{};

// Reads and writes of one row `r`, for the generated math. Loads return float.
template <typename T, typename Args>
struct RowView {
  const Args& args;
  int64_t r;

  AVO_HOST_DEVICE RowView(const Args& a, int64_t row) : args(a), r(row) {}

  AVO_HOST_DEVICE int64_t length() const { return args.length; }

  // Element n of per-element input k.
  AVO_HOST_DEVICE float load(int k, int64_t n) const {
    return Element<T>::to_float(static_cast<const T*>(args.inputs[k])[r * args.length + n]);
  }
  // The value of per-row input k for this row, or `missing` when absent.
  AVO_HOST_DEVICE float load_row(int k, float missing) const {
    const T* p = static_cast<const T*>(args.inputs[k]);
    return p != nullptr ? Element<T>::to_float(p[r]) : missing;
  }
  // Per-row value k that the forward saved for the backward (fp32). 0 for a row past the
  // last (the idle groups of a RegisterRow block).
  AVO_HOST_DEVICE float load_saved(int k) const {
    return r < args.rows ? static_cast<const float*>(args.inputs[k])[r] : 0.0f;
  }
  // The value of per-channel input k for this row's channel, or `missing` when absent.
  AVO_HOST_DEVICE float load_channel(int k, float missing) const {
    const T* p = static_cast<const T*>(args.inputs[k]);
    return p != nullptr ? Element<T>::to_float(p[r % args.channels]) : missing;
  }
  // `value` as an output of the row's dtype holds it, for math that reads an output back
  // (add_layernorm's hidden): the same in every row type and on the CPU.
  AVO_HOST_DEVICE float as_stored(float value) const { return Element<T>::to_float(Element<T>::from_float(value)); }
  AVO_HOST_DEVICE void store(int k, int64_t n, float value) const {
    static_cast<T*>(args.outputs[k])[r * args.length + n] = Element<T>::from_float(value);
  }
};

}  // namespace avo
