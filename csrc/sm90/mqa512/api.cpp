// The head_dim-512 family's route: which calls its kernel takes, with the launch plan.
#include "sm90/mqa512/api.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace dsv4 {

namespace {

// Why the kernel cannot read a dense or varlen call's tensors, or nullptr.
const char* tensors_unsupported(const Mqa512Problem& pr) {
  const Mqa512Shape& s = pr.shape;
  if (pr.q.size(-1) != 512) return "head_dim is not 512";
  if (!tma_compatible(pr.q) || !tma_compatible(pr.kv) ||
      (pr.compressed.defined() && !tma_compatible(pr.compressed))) {
    return "strides TMA cannot describe";
  }
  // CSA: a list is found from a 32-bit row index.
  if (s.topk_k > 0 && (s.varlen ? 1 : s.batch) * s.seqlen_q >= (int64_t{1} << 31)) {
    return "2^31 or more top-k lists";
  }
  // The gather offsets rows by a 32-bit byte stride.
  if (s.topk_k > 0 && pr.compressed.stride(1) * pr.compressed.element_size() >= (int64_t{1} << 32)) {
    return "compressed_kv rows 4 GiB or more apart";
  }
  return nullptr;
}

// Why the kernel's paged mode cannot read a paged call's q and caches, or nullptr.
const char* paged_unsupported(const Mqa512Problem& pr) {
  const Mqa512Shape& s = pr.shape;
  if (s.paged_tiles == 0) return "empty slot lists";
  // A producer lane's list reads and the tile's tokens: at most 32 tokens per work tile.
  if (s.heads_q < 2) return "one query head (a work tile would hold 64 tokens)";
  if (!tma_compatible(pr.q)) return "strides TMA cannot describe";
  for (int i = 0; i < pr.num_paged; ++i) {
    const Mqa512Problem::PagedList& l = pr.paged[i];
    const int64_t page = l.cache.size(1), capacity = l.cache.size(0) * page;
    if ((page & (page - 1)) != 0) return "a page size that is not a power of two";
    if (capacity >= (int64_t{1} << 31)) return "2^31 or more cache slots";
    if (s.seqlen_q * l.slots.size(1) >= (int64_t{1} << 31)) return "2^31 or more slot-list entries";
    if (reinterpret_cast<uintptr_t>(l.cache.data_ptr()) % 16 != 0 || l.cache.stride(0) % 16 != 0) {
      return "a cache whose blocks are not 16-byte aligned";
    }
  }
  return nullptr;
}

}  // namespace

Route<Mqa512Plan> route_mqa512(const Mqa512Problem& pr, const DeviceFacts& device,
                               const Overrides& overrides) {
  using R = Route<Mqa512Plan>;
  if (!device.sm90) return R::reference(device.why_not);
  const Mqa512Shape& s = pr.shape;
  if (pr.q.scalar_type() != at::kBFloat16 && pr.q.scalar_type() != at::kHalf) {
    return R::reference("q is not bf16 or fp16");
  }
  if (const char* why = mqa512_shape_unsupported(s)) return R::reference(why);
  if (const char* why = pr.num_paged > 0 ? paged_unsupported(pr) : tensors_unsupported(pr)) {
    return R::reference(why);
  }
  const Mqa512Plan plan = mqa512_plan_launch(s, device.num_sms, overrides);
  if (plan.tiles >= kMqa512MaxWork) return R::reference("2^26 or more work tiles");
  // CSA: a producer lane holds each token's closed rows (at most 32 tokens per work tile).
  if (s.topk_k > 0 && plan.tile_tokens > 32) {
    return R::reference("top-k rows with one query head per KV head, outside the narrow form");
  }
  return R::kernel(plan);
}

std::string describe(const Mqa512Plan& plan) {
  return "mqa512 tile=" + std::to_string(plan.tile_tokens) + "x" + std::to_string(plan.tile_heads) +
         " splits=" + std::to_string(plan.num_splits) +
         (plan.num_splits > 1 ? (plan.cluster_merge ? " merge=cluster" : " merge=combine") : "") +
         " grid=" + (plan.persistent ? "persistent:" : "per_tile:") + std::to_string(plan.grid) +
         " keys=" + (mqa512_paged_keys(plan.keys)           ? "paged"
                     : plan.keys == Mqa512Keys::kGathered ? "gathered"
                                                          : "tma") +
         (plan.narrow_heads > 0 ? " narrow=" + std::to_string(plan.narrow_heads) : "") +
         (plan.keys == Mqa512Keys::kPagedStaged ? " convert=consumer"
          : plan.keys == Mqa512Keys::kPaged     ? " convert=producer"
                                                : "");
}

#ifndef DSV4_WITH_CUDA
void run_mqa512(const Mqa512Problem&, const Mqa512Plan&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "dsv4: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
