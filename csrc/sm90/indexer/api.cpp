// The indexer's route: the kernels' shapes (bf16/fp16 or float8_e4m3, D = 128, H a power of two
// from 8 to 128, topk up to 2048, dense or varlen; the paged form float8_e4m3 over 64-row pages)
// and the chunking of the score workspace. A varlen call is planned from max_seqlen_q and
// max_seqlen_k, so it needs no host sync.
#include "sm90/indexer/api.h"

#include "sm90/indexer/params.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>

namespace dsv4 {
namespace {
// The workspace's chunks and buffers for plan.total_blocks blocks of queries_per_block rows of
// row_stride floats.
void plan_chunks(IndexerPlan& plan) {
  const IndexerChunks c = indexer_chunks(
      plan.total_blocks, int64_t(plan.queries_per_block) * plan.row_stride * 4);
  plan.buffers = c.buffers;
  plan.num_chunks = c.num_chunks;
  plan.chunk_blocks = c.chunk_blocks;
}

// A launch's rows per SM below which the top-k takes a CTA per query even where a warp's list
// fits: a lone row's latency is then the call's, and a CTA's 512 threads finish a row sooner
// (topk_bench, H200: 64 decode rows of 2048 keys 14 µs on CTAs against 36 µs on warps; an 8k
// prompt's chunks of 2736 rows 0.28 ms against 0.17 ms; the two meet near four rows an SM).
constexpr int64_t kWarpTopkMinRowsPerSm = 4;

// A warp per query where no row is longer than kIndexerWarpTopkRows, topk fits its list and
// a launch has rows enough to fill the SMs' warps (or DSV4_INDEXER_TOPK says which).
bool use_warp_topk(const IndexerPlan& plan, int64_t topk, const DeviceFacts& device,
                   const Overrides& overrides) {
  if (plan.row_stride > kIndexerWarpTopkRows || topk > kIndexerWarpTopkMax) return false;
  if (overrides.indexer_topk_warp >= 0) return overrides.indexer_topk_warp == 1;
  const int64_t rows = int64_t(plan.chunk_blocks) * plan.queries_per_block;
  return rows >= kWarpTopkMinRowsPerSm * std::max(device.num_sms, 1);
}
}  // namespace

Route<IndexerPlan> route_indexer(const IndexerProblem& pr, const DeviceFacts& device,
                                 const Overrides& overrides) {
  using R = Route<IndexerPlan>;
  if (!device.sm90) return R::reference(device.why_not);
  const at::ScalarType dt = pr.q.scalar_type();
  if (dt != at::kBFloat16 && dt != at::kHalf && dt != at::kFloat8_e4m3fn) {
    return R::reference("q is not bf16, fp16 or float8_e4m3fn");
  }
  // Dense q (B, Sq, H, D), k (B, Sc, D); varlen q (T, H, D), k (total_c, D).
  const int64_t batch = pr.varlen ? pr.cu_seqlens_q->size(0) - 1 : pr.q.size(0);
  const int64_t seq_q = pr.varlen ? pr.max_seqlen_q : pr.q.size(1);
  const int64_t seq_c = pr.varlen ? pr.max_seqlen_k : pr.k.size(1);
  const int64_t heads = pr.q.size(-2), dim = pr.q.size(-1);
  const int64_t view_q = pr.varlen ? pr.q.size(0) : seq_q;  // queries along the TMA view
  if (dim != 128) return R::reference("the head dim is not 128");
  if (heads < 8 || heads > kIndexerColumns || (heads & (heads - 1)) != 0) {
    return R::reference("heads not a power of two from 8 to " + std::to_string(kIndexerColumns));
  }
  if (pr.topk > kIndexerMaxTopk) return R::reference("topk above 2048");
  if (batch == 0 || seq_q == 0 || seq_c == 0 || pr.q.numel() == 0 || pr.k.numel() == 0) {
    return R::reference("no queries or no rows");
  }
  // The (query, head) rows must be one stride apart; a lone query's own stride is never used.
  const bool rows_strided = pr.q.size(-3) > 1 && pr.q.stride(-3) != heads * pr.q.stride(-2);
  if (rows_strided || !tma_compatible(pr.q) || !tma_compatible(pr.k)) {
    return R::reference("q or k strides TMA cannot describe (q's heads must be contiguous rows)");
  }
  if (view_q * heads >= (int64_t(1) << 31) || pr.k.size(-2) >= (int64_t(1) << 30) ||
      seq_c >= (int64_t(1) << 30)) {
    return R::reference("more query rows or key rows than the kernels index");
  }
  IndexerPlan plan;
  plan.queries_per_block = static_cast<int>(kIndexerConsumers * kIndexerColumns / heads);
  const int per_block = plan.queries_per_block;
  plan.blocks_per_seq = static_cast<int>((seq_q + per_block - 1) / per_block);
  const int64_t total_blocks = batch * plan.blocks_per_seq;
  if (total_blocks >= (int64_t(1) << 31)) return R::reference("too many query blocks");
  plan.total_blocks = static_cast<int>(total_blocks);
  plan.row_stride = (seq_c + 63) / 64 * 64;
  plan_chunks(plan);
  plan.splits = static_cast<int>((plan.row_stride / 64 + kIndexerTilesPerSplit - 1) /
                                 kIndexerTilesPerSplit);
  plan.smem_keys = static_cast<int>(std::min<int64_t>(seq_c, kIndexerKeyCapacity));
  plan.warp_topk = use_warp_topk(plan, pr.topk, device, overrides);
  return R::kernel(plan);
}

Route<IndexerPlan> route_indexer_paged(const IndexerPagedProblem& pr, const DeviceFacts& device,
                                       const Overrides& overrides) {
  using R = Route<IndexerPlan>;
  if (!device.sm90) return R::reference(device.why_not);
  if (pr.q.scalar_type() != at::kFloat8_e4m3fn) {
    return R::reference("q is not float8_e4m3fn (the paged kernel scores the serving mode)");
  }
  const int64_t batch = pr.q.size(0), tokens = pr.q.size(1), heads = pr.q.size(2);
  const int64_t pages = pr.block_table.size(1), num_blocks = pr.k_cache.size(0);
  if (heads < 8 || heads > kIndexerColumns || (heads & (heads - 1)) != 0) {
    return R::reference("heads not a power of two from 8 to " + std::to_string(kIndexerColumns));
  }
  if (pr.topk > kIndexerMaxTopk) return R::reference("topk above 2048");
  if (pr.k_cache.size(1) != kIndexerPageRows) {
    return R::reference("k_cache's blocks do not hold 64 rows");
  }
  if (batch == 0 || tokens == 0 || pages == 0) return R::reference("no queries or no rows");
  if ((tokens > 1 && pr.q.stride(1) != heads * pr.q.stride(2)) || !tma_compatible(pr.q)) {
    return R::reference("q strides TMA cannot describe (its heads must be contiguous rows)");
  }
  if (pages > 1 && pr.block_table.stride(1) != 1) {
    return R::reference("block_table's rows are not contiguous");
  }
  const bool aligned = reinterpret_cast<uintptr_t>(pr.k_cache.data_ptr()) % 16 == 0 &&
                       (num_blocks == 1 || pr.k_cache.stride(0) % 16 == 0);
  if (!aligned) return R::reference("k_cache's base or block stride is not a multiple of 16 bytes");
  if (tokens * heads >= (int64_t(1) << 31) || num_blocks >= (int64_t(1) << 31) ||
      pages * kIndexerPageRows >= (int64_t(1) << 30)) {
    return R::reference("more query rows or cache rows than the kernels index");
  }
  IndexerPlan plan;
  // 64 columns where a request's queries fit them (decode at 64 heads): no dead half.
  plan.columns = tokens * heads <= 64 ? 64 : kIndexerColumns;
  plan.queries_per_block = static_cast<int>(plan.columns / heads);  // all consumers share them
  plan.blocks_per_seq = static_cast<int>((tokens + plan.queries_per_block - 1) /
                                         plan.queries_per_block);
  const int64_t total_blocks = batch * plan.blocks_per_seq;
  if (total_blocks >= (int64_t(1) << 31)) return R::reference("too many query blocks");
  plan.total_blocks = static_cast<int>(total_blocks);
  plan.row_stride = pages * kIndexerPageRows;
  plan_chunks(plan);
  // About four score CTAs per SM over the table's pages (two run at once): 4 to 32 pages each.
  const int64_t sms = std::max(device.num_sms, 1);
  plan.tiles_per_split = static_cast<int>(
      std::clamp<int64_t>((total_blocks * pages + 4 * sms - 1) / (4 * sms), 4, 32));
  plan.splits = static_cast<int>((pages + plan.tiles_per_split - 1) / plan.tiles_per_split);
  plan.smem_keys = static_cast<int>(std::min<int64_t>(plan.row_stride, kIndexerKeyCapacity));
  plan.warp_topk = use_warp_topk(plan, pr.topk, device, overrides);
  return R::kernel(plan);
}

std::string describe(const IndexerPlan& p) {
  const std::string pages = p.tiles_per_split > 0
                                ? " columns=" + std::to_string(p.columns) +
                                      " pages_per_split=" + std::to_string(p.tiles_per_split)
                                : "";
  return "indexer queries_per_block=" + std::to_string(p.queries_per_block) + pages +
         " chunks=" + std::to_string(p.num_chunks) + "x" + std::to_string(p.chunk_blocks) +
         " buffers=" + std::to_string(p.buffers) + " splits=" + std::to_string(p.splits) +
         " workspace=" + std::to_string((p.workspace_bytes() + (1 << 20) - 1) >> 20) + "MB" +
         (p.warp_topk ? " topk=warp" : " topk=cta");
}

#ifndef DSV4_WITH_CUDA
void run_indexer(const IndexerProblem&, const IndexerPlan&, at::Tensor&) {
  TORCH_CHECK(false, "dsv4: this build has no CUDA kernels");
}
void run_indexer_paged(const IndexerPagedProblem&, const IndexerPlan&, at::Tensor&) {
  TORCH_CHECK(false, "dsv4: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
