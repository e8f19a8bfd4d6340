// Binding-layer helpers shared by every generated row op (reductions over the last
// dimension): argument checks naming the op and the argument, contiguous inputs,
// outputs, the column pass's workspace, and the translation into avo::RowArgs.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <vector>

#include <avo/row_args.h>

#include "map_binding.h"

namespace avo::binding {

// Where a tensor of a row op varies: per element [..., N], per column [N], per row [...];
// in a channel op, per element [B, C, *S] and per channel [C]. Saved: a per-row value the
// forward keeps for the backward (<op>_forward returns it), float32 whatever the dtype,
// [...] ([B, C] in a channel op).
enum class Domain { Elem, Col, Row, Channel, Saved };

struct RowInput {
  const char* name;
  const at::Tensor* tensor;  // nullptr for a missing optional argument
  Domain domain;
};

template <int NumInputs, int NumOutputs>
struct RowCall {
  RowArgs<NumInputs, NumOutputs> args{};
  std::array<at::Tensor, NumOutputs> outputs;
  std::array<at::Tensor, NumInputs> inputs;  // contiguous versions of the arguments
  at::Tensor partials;                       // workspace of the per-column outputs
  std::array<at::Tensor, NumOutputs> channel_rows;  // per-channel outputs before the finish (channel_totals)
  DType dtype = DType::Float32;
  at::Device device = at::kCPU;
  std::array<Domain, NumOutputs> output_domains{};
  std::array<bool, NumOutputs> wanted{};
  int64_t batch = 0, channels = 0;  // channel ops
};

// The op that returns a backward's saved values: avo::layernorm_forward for avo::layernorm_backward.
inline std::string forward_name(const std::string& backward) {
  const std::string suffix = "_backward";
  const bool named = backward.size() > suffix.size() && backward.compare(backward.size() - suffix.size(), suffix.size(), suffix) == 0;
  return named ? backward.substr(0, backward.size() - suffix.size()) + "_forward" : backward;
}

template <int NumInputs, int NumOutputs>
RowCall<NumInputs, NumOutputs> prepare_rows(const char* op, const std::array<RowInput, NumInputs>& inputs,
                                            const std::array<Domain, NumOutputs>& output_domains,
                                            const std::array<bool, NumOutputs>& wanted, int column_sums,
                                            bool channels_first = false) {
  RowCall<NumInputs, NumOutputs> call;
  call.output_domains = output_domains;
  call.wanted = wanted;
  std::array<RowInput, NumInputs> shared_dtype = inputs;  // every argument but the saved values
  for (RowInput& in : shared_dtype)
    if (in.domain == Domain::Saved) in.tensor = nullptr;
  const RowInput& first = check_tensor_arguments(op, shared_dtype);
  call.dtype = to_avo_dtype(op, first.name, first.tensor->scalar_type());
  call.device = first.tensor->device();
  const RowInput* reference = nullptr;  // the first per-element input: it defines rows and N
  for (const RowInput& in : inputs) {
    if (in.tensor != nullptr && in.domain == Domain::Elem) {
      reference = &in;
      break;
    }
  }
  TORCH_INTERNAL_ASSERT(reference != nullptr);
  const at::Tensor& x = *reference->tensor;
  TORCH_CHECK(x.dim() >= 1, op, ": argument '", reference->name, "' must have at least one dimension");
  if (channels_first) {
    TORCH_CHECK(x.dim() >= 2, op, ": argument '", reference->name,
                "' must have at least two dimensions (batch, channel, spatial...), got ", shape_text(x));
    call.batch = x.size(0);
    call.channels = x.size(1);
  }
  // Rows are everything but the reduced dimensions: the last one, or for a channel op
  // everything after (batch, channel).
  const int64_t kept = channels_first ? 2 : x.dim() - 1;
  int64_t length = 1;
  for (int64_t d = kept; d < x.dim(); ++d) length *= x.size(d);
  const auto lead = x.sizes().slice(0, kept);
  for (int k = 0; k < NumInputs; ++k) {
    const RowInput& in = inputs[k];
    if (in.tensor == nullptr) continue;
    const at::Tensor& t = *in.tensor;
    if (in.domain == Domain::Elem) {
      TORCH_CHECK(t.sizes() == x.sizes(), op, ": argument '", in.name, "' has shape ", shape_text(t), " but '",
                  reference->name, "' has shape ", shape_text(x), "; they must match");
    } else if (in.domain == Domain::Channel) {
      TORCH_CHECK(t.dim() == 1 && t.size(0) == call.channels, op, ": argument '", in.name, "' must have shape [",
                  call.channels, "] (the channels of '", reference->name, "'), got ", shape_text(t));
    } else if (in.domain == Domain::Col) {
      TORCH_CHECK(t.dim() == 1 && t.size(0) == length, op, ": argument '", in.name, "' must have shape [",
                  length, "] (the last dimension of '", reference->name, "'), got ", shape_text(t));
    } else if (in.domain == Domain::Saved) {
      TORCH_CHECK(t.scalar_type() == at::kFloat && t.sizes() == lead, op, ": argument '", in.name,
                  "' must be a float32 tensor of shape ", shape_text(lead), " (one value per row of '", reference->name,
                  "', as ", forward_name(op), " returns it), got ", dtype_name(t.scalar_type()), " ", shape_text(t));
      TORCH_CHECK(t.device() == x.device(), op, ": argument '", in.name, "' is on ", t.device(), " but '",
                  reference->name, "' is on ", x.device(), "; all tensor arguments must be on one device");
    } else {
      TORCH_CHECK(t.sizes() == lead, op, ": argument '", in.name, "' must have the shape of '", reference->name,
                  "' without its last dimension, got ", shape_text(t));
    }
    call.inputs[k] = t.contiguous();  // a copy only when the argument is not dense already
    call.args.inputs[k] = call.inputs[k].data_ptr();
  }
  const auto options = x.options();
  for (int k = 0; k < NumOutputs; ++k) {
    if (!wanted[k]) {  // the gradient of a missing input: an empty tensor; a saved value: none
      if (output_domains[k] != Domain::Saved) call.outputs[k] = at::empty({0}, options);
      call.args.outputs[k] = nullptr;
      continue;
    }
    if (output_domains[k] == Domain::Elem) call.outputs[k] = at::empty(x.sizes(), options);
    if (output_domains[k] == Domain::Row) call.outputs[k] = at::empty(lead, options);
    if (output_domains[k] == Domain::Col) call.outputs[k] = at::empty({length}, options);
    // Per-channel results are first one fp32 value per row; channel_totals sums the batch.
    if (output_domains[k] == Domain::Channel || output_domains[k] == Domain::Saved)
      call.outputs[k] = at::empty(lead, options.dtype(at::kFloat));
    call.args.outputs[k] = call.outputs[k].data_ptr();
  }
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  call.args.rows = rows;
  call.args.length = length;
  call.args.channels = call.channels;

  bool column_outputs = false;
  for (int k = 0; k < NumOutputs; ++k) column_outputs |= wanted[k] && output_domains[k] == Domain::Col;
  if (column_outputs && rows == 0) {  // nothing to sum: the gradients are zero
    for (int k = 0; k < NumOutputs; ++k)
      if (wanted[k] && output_domains[k] == Domain::Col) call.outputs[k].zero_();
  }
  if (column_outputs && rows > 0 && column_sums > 0) {
    avo::chunk_rows(call.args);
    // Uninitialised: every kernel version sets each chunk's partials (its first row or its
    // whole sums at once) before it adds to them. On the GPU the tiled version's tile sums
    // follow them (avo/row_args.h).
    const int64_t partial_floats = column_sums * call.args.chunks * length;
    const int64_t tiles = call.device.is_cuda() ? avo::row_tiles(length, x.element_size()) : 0;
    const int64_t tile_floats = tiles >= 2 ? avo::tiled_scratch_floats(rows, tiles) : 0;
    call.partials = at::empty({partial_floats + tile_floats}, options.dtype(at::kFloat));
    call.args.partials = static_cast<float*>(call.partials.data_ptr());
    if (tile_floats > 0) call.args.tile_sums = call.args.partials + partial_floats;
  }
  return call;
}

// Per-channel outputs (gradients of [C] parameters): the kernels wrote one fp32 value per
// row, [batch, channels]. Swaps each wanted one for a [channels] tensor in `dtype` (kept
// in call.channel_rows) and returns the column totals that sum the batch into them, for
// the op's generated finish (backward_channels_finish_cpu / _cuda).
template <int NumInputs, int NumOutputs>
ColumnTotals channel_totals(RowCall<NumInputs, NumOutputs>& call, at::ScalarType dtype) {
  ColumnTotals totals{};
  totals.rows = call.batch;
  totals.length = call.channels;
  for (int k = 0; k < NumOutputs; ++k) {
    if (!call.wanted[k] || call.output_domains[k] != Domain::Channel) continue;
    TORCH_CHECK(totals.count < kMaxColumnTotals, "avo: more per-channel outputs than ColumnTotals holds");
    call.channel_rows[k] = call.outputs[k];
    call.outputs[k] = at::empty({call.channels}, call.channel_rows[k].options().dtype(dtype));
    totals.sources[totals.count] = static_cast<const float*>(call.channel_rows[k].data_ptr());
    totals.targets[totals.count] = call.outputs[k].data_ptr();
    ++totals.count;
  }
  return totals;
}

// Rows per CPU task: about kGrainElements elements of work each.
inline int64_t row_grain(int64_t length) {
  constexpr int64_t kGrainElements = 32768;
  return length > 0 ? (kGrainElements + length - 1) / length : kGrainElements;
}

// Runs f(begin, end) over the rows in parallel on the CPU; when there are per-column
// sums, each task takes whole chunks (a chunk's partials have one writer).
template <typename Args, typename F>
void parallel_rows(const Args& args, const F& f) {
  if (args.partials == nullptr) {
    at::parallel_for(0, args.rows, row_grain(args.length), f);
    return;
  }
  at::parallel_for(0, args.chunks, 1, [&](int64_t first, int64_t last) {
    f(first * args.rows_per_chunk, std::min(last * args.rows_per_chunk, args.rows));
  });
}

}  // namespace avo::binding
