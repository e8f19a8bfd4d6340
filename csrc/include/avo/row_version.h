// Which version of the row kernels launch_row_op takes (avo/row_cuda.cuh): the one its
// table picks for the call, unless a caller forced one. Forcing is for tests and
// benchmarks, which run every version on the same inputs (avo_ops._C.set_row_version).
// Plain C++, so that the Python module can set it.
#pragma once

#include <cstdint>

namespace avo {

// The measured part of the dispatch of one row kernel (forward or backward of an op):
// on GPUs of compute capability `arch` (major * 10 + minor; 0: any other GPU), rows of
// 16-byte vectors take the global version from global_min_vectors[t] vectors on, else
// the staged version from staged_min_vectors[t] on where it fits, t indexing float16,
// bfloat16, float32; the register version they take otherwise loads the next row while
// it computes one from pipelined_min_vectors[t] on (where the kernel can: kCanPipeline in
// avo/row_cuda.cuh). A backward with per-column sums takes the tiled version from
// tiled_min_vectors[t] on, before any other (where it can: kCanTile). Rows that the
// registers of a block or its shared memory hold take the cluster version instead from
// cluster_min_vectors[t] on (where it fits; sm_90). The register version takes wide rows
// (groups of 512 threads holding twice the vectors, where the math can: kWideRow) from
// wide_min_vectors[t] on, and where only they hold the row; narrow rows (twice the
// threads holding half the vectors, for maths without per-column sums: kNarrowRow) up
// to narrow_max_vectors[t] (before wide rows). A backward with per-column
// sums spreads its rows over coarse chunks (rows_per_chunk in avo/row_args.h) from
// coarse_chunks_min_vectors[t] on. A cluster row without per-column sums takes small
// blocks (a quarter of the threads, cluster_block_threads in avo/row_cuda.cuh) from
// small_cluster_blocks_min_vectors[t] on. The tiled version runs as one kernel (where all
// its blocks fit on the GPU at once) from one_kernel_min_vectors[t] on, else as two. A
// cluster row with per-column sums prefetches the rows of its chunk into L2 from
// prefetch_min_vectors[t] on. The generated sources hold these tables, from the files of
// tuning/ (benchmarks/tune_rows.py writes them). A row with a `gpu` is that GPU's own
// (its device name exactly), and comes before its arch's row: a GPU takes the first row
// that is its own or its arch's.
struct RowTuning {
  int arch;
  int64_t staged_min_vectors[3];
  int64_t global_min_vectors[3];
  int64_t pipelined_min_vectors[3];
  int64_t tiled_min_vectors[3];
  int64_t cluster_min_vectors[3];
  int64_t wide_min_vectors[3];
  int64_t coarse_chunks_min_vectors[3];
  int64_t narrow_max_vectors[3];
  int64_t small_cluster_blocks_min_vectors[3];
  int64_t one_kernel_min_vectors[3];
  int64_t prefetch_min_vectors[3];
  const char* gpu = nullptr;  // nullptr: every GPU of `arch` without a row of its own
};

// A version never taken by choice, only where no other fits: the threshold of a line
// that gives a version rows from a length on (the *_min_vectors), and of one that gives
// it rows up to a length (narrow_max_vectors).
constexpr int64_t kNever = INT64_MAX;
constexpr int64_t kNeverUpTo = 0;

// The thresholds of one call: its GPU's row of the table, at its element type.
struct RowThresholds {
  int64_t staged_min_vectors = kNever;
  int64_t global_min_vectors = kNever;
  int64_t pipelined_min_vectors = kNever;
  int64_t tiled_min_vectors = kNever;
  int64_t cluster_min_vectors = kNever;
  int64_t wide_min_vectors = kNever;
  int64_t coarse_chunks_min_vectors = kNever;
  int64_t narrow_max_vectors = kNeverUpTo;
  int64_t small_cluster_blocks_min_vectors = kNever;
  int64_t one_kernel_min_vectors = kNever;
  int64_t prefetch_min_vectors = kNever;
};

// kPipelined is the register version loading the next row ahead (pipelined_rows), kWide
// the register version on wide rows (wide_row_kernel), kNarrow on narrow rows
// (narrow_row_kernel); kTiled cuts rows into column tiles (TiledRow).
enum class RowVersion { kAuto = -1, kRegister, kPipelined, kWide, kStaged, kCluster, kGlobal, kTiled, kNarrow };

// The process-wide choice of a kind E of the GPU rows' dispatch (RowVersion, ChunkSize,
// ClusterBlocks, TiledKernels below): E::kAuto, as the dispatch table says, unless a test
// or benchmark forced one (avo_ops._C.set_row_version, set_chunk_size,
// set_cluster_blocks, set_tiled_kernels). A forced version that a call cannot take (a
// row too long for registers, say) is ignored for that call.
template <typename E>
inline E& forced() {
  static E choice = E::kAuto;
  return choice;
}

// Whether a call takes `choice`, one of the two of kind E (ChunkSize, ClusterBlocks,
// TiledKernels, RowPrefetch): where it is forced, whether that is the one forced; else
// `table_takes_it`, what the dispatch table says for the call.
template <typename E>
inline bool takes(E choice, bool table_takes_it) {
  const E chosen = forced<E>();
  return chosen == E::kAuto ? table_takes_it : chosen == choice;
}

// The version the last CUDA row-op call took (kAuto before any): a benchmark that forces
// a version reads it to know whether its times are that version's.
inline RowVersion& last_row_version() {
  static RowVersion last = RowVersion::kAuto;
  return last;
}

// The chunks of a GPU backward with per-column sums: as its table says (kAuto), or forced
// fine or coarse (rows_per_chunk's `coarse`), for tests and benchmarks
// (avo_ops._C.set_chunk_size). The rows a chunk of the last call with per-column sums:
// a benchmark reads it to know whether forcing changed the chunks.
enum class ChunkSize { kAuto = -1, kFine, kCoarse };
inline int64_t& last_rows_per_chunk() {
  static int64_t last = 0;
  return last;
}

// The blocks of a GPU cluster row without per-column sums: as its table says (kAuto), or
// forced full or small (cluster_block_threads' `small`), for tests and benchmarks
// (avo_ops._C.set_cluster_blocks). The threads of a block of the last call that took the
// cluster version (0 before any): a benchmark reads it to know whether forcing changed
// the blocks.
enum class ClusterBlocks { kAuto = -1, kFull, kSmall };
inline int& last_cluster_block_threads() {
  static int last = 0;
  return last;
}

// Whether a GPU cluster row with per-column sums asks L2 for the rows of its chunk ahead
// of their loads (RegisterRow::prefetch_row): as its table says (kAuto), or forced off
// or on, for tests and benchmarks (avo_ops._C.set_row_prefetch). Whether the last call
// did (kAuto: it took no version that can, or there was none): a benchmark reads it to
// know whether forcing made a difference.
enum class RowPrefetch { kAuto = -1, kOff, kOn };
inline RowPrefetch& last_row_prefetch() {
  static RowPrefetch last = RowPrefetch::kAuto;
  return last;
}

// The group width of the last CUDA row-op call, where it took a kernel of register,
// lean or narrow rows that fixes the width when it is compiled (kFixedGroupWidths in
// avo/row_cuda.cuh); 0 where its kernel takes the width at run time, or before any
// call: a test reads it to know which kernel ran.
inline int& last_fixed_group_threads() {
  static int last = 0;
  return last;
}

// The kernels of the tiled version: as its table says (kAuto: one from the "one" line on,
// where all its blocks fit on the GPU at once, else two), or forced, for tests and
// benchmarks (avo_ops._C.set_tiled_kernels; a forced one kernel that does not fit runs
// two). The form the last call of the tiled version took (kAuto before any): a benchmark
// reads it to know which it timed.
enum class TiledKernels { kAuto = -1, kTwo, kOne };
inline TiledKernels& last_tiled_kernels() {
  static TiledKernels last = TiledKernels::kAuto;
  return last;
}

}  // namespace avo
