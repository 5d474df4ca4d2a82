// The sm90 fmha family's plan: which calls it takes, and every launch decision (keys per tile,
// packed GQA, the work order's sections, split-KV, the grid). Same-run timings behind each
// choice are in docs/fmha.md.
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

#include "sm90/fmha/api.h"
#include "sm90/shared/split_kv.h"
#include "sm90/shared/varlen_schedule.h"

namespace dsv4 {
namespace {

// The kernel's numbers (FmhaSm90Traits; launch.cuh asserts they agree). D = 64 runs three
// consumer warpgroups of 64 rows, the others two.
int block_m_of(int64_t head_dim) { return head_dim == 64 ? 192 : 128; }
// Whether the producer publishes each work tile's index, which the dynamic grid needs
// (kPublishWorkTiles: it cost 5-10% at 176 keys and at head_dim 256).
bool publishes_work_tiles(int64_t head_dim, int block_n) {
  return head_dim == 64 || (head_dim == 128 && block_n == 128);
}

// Keys per tile. At head_dim 128, 176 measured 1-7% faster than 128 on long full rows; under a
// causal mask or a window 128 wastes less of the diagonal tiles, as FlashAttention-3 also
// chooses. Varlen calls take 128 (176 measured no faster there, and its varlen kernel spilled).
int block_n_of(const FmhaProblem& c, const Overrides& o) {
  if (c.head_dim == 64) return 128;
  if (c.head_dim == 256) return 80;
  if (c.varlen) return 128;
  if (o.fmha_d128_block_n != 0) return o.fmha_d128_block_n;
  return c.causal || c.window_left >= 0 ? 128 : 176;
}

// Packed GQA (dense calls): the query heads that share a KV head fill a work tile's rows, so
// each K/V tile is read once per group rather than once per query head. It needs the group to
// divide block_m or be a multiple of it, and pays when the packed tiles are noticeably fuller
// (decode, short queries).
void plan_packing(const FmhaProblem& c, const Overrides& o, FmhaPlan& plan) {
  plan.pack_tokens = plan.block_m;
  plan.pack_heads = 1;
  const int64_t group = c.heads_q / c.heads_kv;
  if (c.varlen || group == 1 || (plan.block_m % group != 0 && group % plan.block_m != 0)) return;
  const int tokens = static_cast<int>(std::max<int64_t>(1, plan.block_m / group));
  const int heads = static_cast<int>(std::min<int64_t>(group, plan.block_m));
  auto fill = [&](int64_t t) {  // valid rows per row of the query tiles
    return double(c.seqlen_q) / double((c.seqlen_q + t - 1) / t * t);
  };
  const bool pack = o.fmha_pack_gqa >= 0 ? o.fmha_pack_gqa == 1
                                         : fill(plan.block_m) < 0.9 * fill(tokens);
  if (pack) {
    plan.pack_tokens = tokens;
    plan.pack_heads = heads;
  }
}

// The work order's sections (decode_tile in work_tile.cuh), so that the K/V of the heads that
// concurrent CTAs work on fit in L2. Dense: how many (batch, head group) units share a section;
// only masked calls need the order across heads (their query tiles differ in cost), unmasked
// ones keep one unit per section. Varlen: query heads per section, whole KV heads' groups
// dividing Hq, sized for the longest sequence.
int section_units_of(const FmhaProblem& c, int pack_heads) {
  constexpr int64_t kL2Budget = 32 << 20;  // bytes of K/V in flight (H100: 50 MB of L2)
  const int64_t kv_head_bytes = 2 * c.seqlen_k * c.head_dim * c.q.element_size();
  const int64_t kv_heads_in_l2 =
      std::max<int64_t>(1, kL2Budget / std::max<int64_t>(1, kv_head_bytes));
  const int64_t group = c.heads_q / std::max<int64_t>(1, c.heads_kv);
  if (c.varlen) {
    int64_t kv_heads = std::max<int64_t>(1, std::min(c.heads_kv, kv_heads_in_l2));
    while (c.heads_kv % kv_heads != 0) --kv_heads;
    return static_cast<int>(kv_heads * group);
  }
  if (!c.causal && c.window_left < 0) return 1;
  const int64_t units_per_kv_head = std::max<int64_t>(1, group / pack_heads);
  const int64_t units = c.batch * c.heads_q / pack_heads;
  return static_cast<int>(std::min(units, kv_heads_in_l2 * units_per_kv_head));
}

// Equal work tiles (dense, unmasked) take the static persistent grid: it overlaps each CTA's
// next Q load with its last PV and epilogue (non-causal 1k: +14% over one CTA per tile).
// Unequal ones (causal, windowed, varlen) take the dynamic persistent grid, the costliest tiles
// first (causal 1k: +11-19%), where the kernel publishes its work tiles, and one CTA per work
// tile elsewhere.
FmhaGrid grid_of(const FmhaProblem& c, const FmhaPlan& plan, const Overrides& o) {
  const bool publishes = publishes_work_tiles(c.head_dim, plan.block_n);
  switch (o.fmha_grid) {
    case FmhaGridOverride::kPerTile: return FmhaGrid::kPerTile;
    case FmhaGridOverride::kPersistent: return FmhaGrid::kPersistent;
    case FmhaGridOverride::kDynamic:
      TORCH_CHECK(publishes, "fmha: DSV4_FMHA_GRID=dynamic needs head_dim 64, or head_dim 128 ",
                  "with 128 keys per tile; this call has head_dim ", c.head_dim, " and ",
                  plan.block_n, " keys per tile");
      return FmhaGrid::kDynamic;
    case FmhaGridOverride::kAuto: break;
  }
  if (!c.varlen && !c.causal && c.window_left < 0) return FmhaGrid::kPersistent;
  return publishes ? FmhaGrid::kDynamic : FmhaGrid::kPerTile;
}

const char* unsupported(const FmhaProblem& c) {
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) {
    return "head_dim is not 64, 128 or 256";
  }
  if (!(c.scale > 0.0)) return "scale <= 0 (the kernel takes the max before scaling)";
  if (c.batch < 1 || c.heads_q < 1) return "an empty q";
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (c.varlen) {
    // Rows of the packed tensors (plus a tile past the end) and work-tile slots are int; an
    // empty q or k has no memory to describe (and nothing to compute).
    const int64_t total_q = c.q.size(1), total_k = c.k.size(1);
    if (total_q < 1 || total_k < 1) return "an empty q or k";
    if (total_q > kMaxInt / 2 || total_k > kMaxInt / 2) return "2^30 or more packed rows";
    if (varlen_tile_capacity(total_q, c.batch, 64) * c.heads_q > kMaxInt) {
      return "2^31 or more work tiles";
    }
  } else {
    if (c.seqlen_q < 1 || c.seqlen_k < 1) return "an empty q or k";
    if ((c.seqlen_q / 64 + 1) * c.heads_q * c.batch > kMaxInt) return "2^31 or more work tiles";
    if (c.seqlen_k > kMaxInt - c.seqlen_q) return "2^31 or more query and key positions";
  }
  if (!tma_compatible(c.q) || !tma_compatible(c.k) || !tma_compatible(c.v)) {
    return "strides TMA cannot describe";
  }
  return nullptr;
}

}  // namespace

Route<FmhaPlan> route_fmha(const FmhaProblem& c, const DeviceFacts& device,
                           const Overrides& o) {
  using R = Route<FmhaPlan>;
  if (!device.sm90) return R::reference(device.why_not);
  if (const char* why = unsupported(c)) return R::reference(why);
  FmhaPlan plan;
  plan.head_dim = static_cast<int>(c.head_dim);
  plan.block_m = block_m_of(c.head_dim);
  plan.block_n = block_n_of(c, o);
  plan_packing(c, o, plan);
  plan.section_units = section_units_of(c, plan.pack_heads);
  if (c.varlen) {
    plan.work_tiles = varlen_tile_capacity(c.q.size(1), c.batch, plan.block_m) * c.heads_q;
  } else {
    plan.num_m_blocks = (c.seqlen_q + plan.pack_tokens - 1) / plan.pack_tokens;
    plan.work_tiles = plan.num_m_blocks * (c.heads_q / plan.pack_heads) * c.batch;
    // Split-KV when the work tiles cannot fill the SMs (decode, short queries).
    const int64_t key_tiles =
        split_kv_max_key_tiles(c.seqlen_k, c.window_left, plan.block_m, plan.block_n);
    plan.num_splits = split_kv_splits(plan.work_tiles, key_tiles, device.num_sms, o.split_kv);
  }
  plan.grid = grid_of(c, plan, o);
  const int64_t work = plan.work_tiles * plan.num_splits;
  plan.ctas = plan.grid == FmhaGrid::kPerTile ? work : std::min<int64_t>(work, device.num_sms);
  return R::kernel(plan);
}

std::string describe(const FmhaPlan& p) {
  const char* grid = p.grid == FmhaGrid::kPerTile     ? "per_tile:"
                     : p.grid == FmhaGrid::kPersistent ? "persistent:"
                                                       : "dynamic:";
  return "fmha d=" + std::to_string(p.head_dim) + " n=" + std::to_string(p.block_n) +
         " pack=" + std::to_string(p.pack_tokens) + "x" + std::to_string(p.pack_heads) +
         " sections=" + std::to_string(p.section_units) +
         " splits=" + std::to_string(p.num_splits) + " grid=" + grid + std::to_string(p.ctas);
}

#ifndef DSV4_WITH_CUDA
void run_fmha(const FmhaProblem&, const FmhaPlan&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "fmha: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
