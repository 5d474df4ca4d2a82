// The indexer's launch: per chunk, the score kernel (dense or paged) then the top-k kernel over a
// workspace of one or two buffers (no host sync: the chunking depends on shapes only).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>

#include <cmath>
#include <type_traits>

#include "sm90/indexer/api.h"
#include "sm90/indexer/paged_score.cuh"
#include "sm90/indexer/score.cuh"
#include "sm90/indexer/topk.cuh"
#include "sm90/shared/host.h"

namespace dsv4 {
namespace {
constexpr const char* kOp = "dsv4_indexer_topk";
constexpr const char* kPagedOp = "dsv4_indexer_topk_paged";

// Chunk c: its scores into buffer c % buffers (`launch_scores(params, stream)`), then its
// top-k. With two buffers, the chunks of buffer 1 run on `side`: each stream works through its
// own buffer's chunks in order, and the two fill each other's idle SMs at every kernel's last
// wave. `side` starts after the work queued on `stream` so far, and `stream` waits for `side` at
// the end.
template <typename LaunchScores>
void launch_chunks(const IndexerParams& base, const IndexerPlan& plan, int device,
                   const at::cuda::CUDAStream& stream, const at::cuda::CUDAStream& side,
                   LaunchScores&& launch_scores) {
  const int topk_smem = plan.smem_keys * 4;
  const auto topk_kernel =
      plan.smem_keys <= kIndexerThreeCtaKeys ? indexer_topk_kernel<3> : indexer_topk_kernel<2>;
  allow_dynamic_smem<indexer_topk_kernel<2>>(device, kIndexerKeyCapacity * 4);
  allow_dynamic_smem<indexer_topk_kernel<3>>(device, kIndexerThreeCtaKeys * 4);
  allow_dynamic_smem<indexer_topk_warp_kernel>(device, IndexerWarpTopkTraits::kSmemBytes);
  const int rows = plan.chunk_blocks * plan.queries_per_block;  // the top-k's queries a chunk
  at::cuda::CUDAEvent fork, join;
  if (plan.buffers == 2) {
    fork.record(stream);
    fork.block(side);
  }
  for (int c = 0; c < plan.num_chunks; ++c) {
    const int b = c % plan.buffers;
    const cudaStream_t on = b == 0 ? stream.stream() : side.stream();
    IndexerParams p = base;
    p.chunk = c;
    p.scores = base.scores + b * plan.buffer_floats();
    launch_scores(p, on);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // The top-k follows its scores by programmatic dependent launch: the score kernel does not
    // trigger early (waiting top-k CTAs would take the SMs its later waves need), so the top-k
    // grid starts as the last score CTA exits, its launch under that CTA's end.
    if (plan.warp_topk) {
      using W = IndexerWarpTopkTraits;
      launch_kernel(indexer_topk_warp_kernel, (rows + W::kWarps - 1) / W::kWarps, W::kThreads,
                    W::kSmemBytes, on, true, p);
    } else {
      launch_kernel(topk_kernel, rows, IndexerTopkTraits::kThreads, topk_smem, on, true, p);
    }
  }
  if (plan.buffers == 2) {
    join.record(side);
    join.block(stream);
  }
}

// A score kernel (score.cuh's or paged_score.cuh's) and the top-k, chunk by chunk.
template <typename Traits, auto kScore>
void launch_kernels(const IndexerParams& p, const IndexerPlan& plan, const CUtensorMap& tq,
                    const CUtensorMap& tk, int device, const at::cuda::CUDAStream& stream,
                    const at::cuda::CUDAStream& side) {
  allow_dynamic_smem<kScore>(device, Traits::kSmemBytes);
  launch_chunks(p, plan, device, stream, side, [&](const IndexerParams& chunk, cudaStream_t on) {
    kScore<<<dim3(plan.splits, plan.chunk_blocks), Traits::kThreads, Traits::kSmemBytes, on>>>(
        tq, tk, chunk);
  });
}

// The plain fields of params.h shared by both forms: weights, positions, the scale, the
// workspace and the plan's chunking (the rest per form).
IndexerParams common_params(const at::Tensor& weights, const at::Tensor& positions,
                            const at::Tensor& positions_view, int64_t heads, int64_t topk,
                            int64_t compress_ratio, double scale, const IndexerPlan& plan,
                            const at::Tensor& workspace, at::Tensor& out) {
  IndexerParams p{};
  p.weights = weights.data_ptr<float>();
  p.weight_scale = static_cast<float>(std::fabs(scale));
  p.positions = positions.data_ptr();
  p.positions_64 = positions.scalar_type() == at::kLong;
  p.pos_stride_b = positions_view.stride(0);
  p.pos_stride_s = positions_view.stride(1);
  p.sign = scale > 0 ? 1.f : (scale < 0 ? -1.f : 0.f);
  p.scores = workspace.data_ptr<float>();
  p.row_stride = plan.row_stride;
  p.out = out.data_ptr<int32_t>();
  p.heads = static_cast<int>(heads);
  p.topk = static_cast<int>(topk);
  p.compress_ratio = static_cast<int>(std::min<int64_t>(compress_ratio, 1 << 30));
  p.head_levels = 0;
  while ((8 << p.head_levels) < heads) ++p.head_levels;
  p.queries_per_block = plan.queries_per_block;
  p.blocks_per_seq = plan.blocks_per_seq;
  p.total_blocks = plan.total_blocks;
  p.num_chunks = plan.num_chunks;
  p.chunk_blocks = plan.chunk_blocks;
  p.smem_keys = plan.smem_keys;
  return p;
}

// The second buffer's stream (launch_chunks).
at::cuda::CUDAStream side_stream(const IndexerPlan& plan, int device,
                                 const at::cuda::CUDAStream& stream) {
  return plan.buffers == 2 ? at::cuda::getStreamFromPool(false, device) : stream;
}

}  // namespace

void run_indexer(const IndexerProblem& pr, const IndexerPlan& plan, at::Tensor& out) {
  // The (Bv, Sv, ...) views of params.h: varlen tensors are one sequence of T queries and
  // total_c rows, in which cu_seqlens place each sequence.
  const at::Tensor q = pr.varlen ? pr.q.unsqueeze(0) : pr.q;  // (Bv, Sv, H, D)
  const at::Tensor k = pr.varlen ? pr.k.unsqueeze(0) : pr.k;  // (Bv, Sc_v, D)
  const at::Tensor positions = pr.varlen ? pr.positions.unsqueeze(0) : pr.positions;
  const int64_t heads = q.size(2);
  // q as (Bv, Sv H, 1, D): a q row per (query, head), a consumer's N rows in one box.
  const at::Tensor q_rows = q.as_strided({q.size(0), q.size(1) * heads, 1, q.size(3)},
                                         {q.stride(0), q.stride(2), q.stride(2), q.stride(3)});
  const CUtensorMap tq = make_tensor_map_bshd(kOp, q_rows, "q", kIndexerColumns, 1);
  const CUtensorMap tk = make_tensor_map_bshd(kOp, k.unsqueeze(2), "k", 64, 1);
  const at::Tensor weights = pr.weights.to(at::kFloat).contiguous();  // as given when fp32
  const std::optional<at::Tensor>& k_scale = pr.k_scale;  // fp32; always given with FP8
  const at::Tensor workspace =
      at::empty({plan.workspace_bytes() / 4}, pr.q.options().dtype(at::kFloat));
  IndexerParams p = common_params(weights, pr.positions, positions, heads, pr.topk,
                                  pr.compress_ratio, pr.scale, plan, workspace, out);
  p.k_scale = k_scale ? k_scale->data_ptr<float>() : nullptr;
  p.k_scale_stride_b = k_scale && !pr.varlen ? k_scale->stride(0) : 0;
  p.k_scale_stride_s = k_scale ? k_scale->stride(-1) : 0;
  if (pr.varlen) {
    p.cu_seqlens_q = pr.cu_seqlens_q->data_ptr<int>();
    p.cu_seqlens_k = pr.cu_seqlens_k->data_ptr<int>();
    p.total_q = static_cast<int>(pr.q.size(0));
    p.total_c = static_cast<int>(pr.k.size(0));
  }
  p.seq_q = static_cast<int>(pr.varlen ? pr.max_seqlen_q : q.size(1));
  p.seq_c = static_cast<int>(pr.varlen ? pr.max_seqlen_k : k.size(1));
  const int device = pr.q.get_device();
  const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream(device);
  const at::cuda::CUDAStream side = side_stream(plan, device, stream);
  const auto launch = [&](auto element) {
    using Element = decltype(element);
    launch_kernels<IndexerScoreTraits<Element>, indexer_score_kernel<Element>>(
        p, plan, tq, tk, device, stream, side);
  };
  if (pr.q.scalar_type() == at::kBFloat16) {
    launch(__nv_bfloat16{});
  } else if (pr.q.scalar_type() == at::kFloat8_e4m3fn) {
    launch(__nv_fp8_e4m3{});
  } else {
    launch(__half{});
  }
}

void run_indexer_paged(const IndexerPagedProblem& pr, const IndexerPlan& plan, at::Tensor& out) {
  const at::Tensor& q = pr.q;  // (B, N, H, 128) float8_e4m3fn
  const int64_t batch = q.size(0), heads = q.size(2);
  const int64_t num_blocks = pr.k_cache.size(0);
  const int64_t block_stride = num_blocks == 1 ? kIndexerPageRows * 132 : pr.k_cache.stride(0);
  // q as (B, N H, 1, D): the block's (query, head) rows in one box; the cache's values as
  // (num_blocks, 64, 1, 128) bytes, a page per box.
  const at::Tensor q_rows = q.as_strided({batch, q.size(1) * heads, 1, q.size(3)},
                                         {q.stride(0), q.stride(2), q.stride(2), q.stride(3)});
  const at::Tensor values = pr.k_cache.as_strided({num_blocks, kIndexerPageRows, 1, 128},
                                                  {block_stride, 128, 128, 1});
  const CUtensorMap tq = make_tensor_map_bshd(kPagedOp, q_rows, "q", plan.columns, 1);
  const CUtensorMap tk = make_tensor_map_bshd(kPagedOp, values, "k_cache", kIndexerPageRows, 1);
  const at::Tensor weights = pr.weights.to(at::kFloat).contiguous();
  const at::Tensor lens = pr.context_lens.to(at::kInt);  // on the device: no sync
  const at::Tensor workspace =
      at::empty({plan.workspace_bytes() / 4}, q.options().dtype(at::kFloat));
  IndexerParams p = common_params(weights, pr.positions, pr.positions, heads, pr.topk,
                                  pr.compress_ratio, pr.scale, plan, workspace, out);
  p.context_lens = lens.data_ptr<int>();
  p.seq_q = static_cast<int>(q.size(1));
  p.seq_c = static_cast<int>(pr.block_table.size(1) * kIndexerPageRows);
  p.paged.base = static_cast<const uint8_t*>(pr.k_cache.data_ptr());
  p.paged.block_stride = block_stride;
  p.paged.num_blocks = static_cast<int>(num_blocks);
  p.paged.block_table = pr.block_table.data_ptr();
  p.paged.table_64 = pr.block_table.scalar_type() == at::kLong;
  p.paged.table_stride = pr.block_table.stride(0);
  p.paged.tiles_per_split = plan.tiles_per_split;
  const int device = q.get_device();
  const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream(device);
  const at::cuda::CUDAStream side = side_stream(plan, device, stream);
  const auto launch = [&](auto columns) {
    constexpr int kColumns = decltype(columns)::value;
    launch_kernels<IndexerPagedTraits<kColumns>, indexer_paged_score_kernel<kColumns>>(
        p, plan, tq, tk, device, stream, side);
  };
  if (plan.columns == 64) {
    launch(std::integral_constant<int, 64>{});
  } else {
    launch(std::integral_constant<int, kIndexerColumns>{});
  }
}

}  // namespace dsv4
