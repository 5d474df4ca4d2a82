// Host side of the sm90 fmha kernel shared by its two translation units (dense calls in
// fmha_sm90.cu, varlen calls in sm90/fmha/launch_varlen.cu, compiled in parallel): the grid choice,
// tensor maps from the tensors' real strides, and the launch.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "sm90/shared/split_kv.h"
#include "sm90/shared/split_kv_combine.cuh"
#include "sm90/shared/host.h"
#include "ops/fmha.h"
#include "sm90/fmha/kernel.cuh"

namespace dsv4 {

// The grid (sm90/shared/tile_scheduler.cuh), from same-run timings (benchmarks/NOTES.md).
// Equal work tiles (dense, non-causal, no window) take the static persistent grid: it overlaps
// each CTA's next Q load with its last PV and epilogue (non-causal 1k: +14% over one CTA per
// tile, 4k: +3-5%, 16k: +0-5%). Unequal ones (causal, windowed, varlen) take the dynamic
// persistent grid, the costliest tiles first (causal 1k: +11-19%), where the kernel publishes
// its work tiles (`publishes`: head_dim 64, and 128 with 128 keys per tile), and one CTA per
// work tile elsewhere. DSV4_FMHA_GRID=per_tile|persistent|dynamic overrides the choice, for
// tests and timing.
enum class FmhaGrid { kPerTile, kPersistent, kDynamic };

inline FmhaGrid fmha_grid(const FmhaCall& c, bool publishes, int block_n) {
  if (const char* grid = std::getenv("DSV4_FMHA_GRID")) {
    if (std::strcmp(grid, "per_tile") == 0) return FmhaGrid::kPerTile;
    if (std::strcmp(grid, "persistent") == 0) return FmhaGrid::kPersistent;
    if (std::strcmp(grid, "dynamic") == 0) {
      TORCH_CHECK(publishes, "fmha: DSV4_FMHA_GRID=dynamic needs head_dim 64, or head_dim 128 ",
                  "with 128 keys per tile; this call has head_dim ", c.head_dim, " and ",
                  block_n, " keys per tile");
      return FmhaGrid::kDynamic;
    }
    TORCH_CHECK(false, "fmha: DSV4_FMHA_GRID must be per_tile, persistent or dynamic, got '",
                grid, "'");
  }
  if (!c.varlen && !c.causal && c.window_left < 0) return FmhaGrid::kPersistent;
  return publishes ? FmhaGrid::kDynamic : FmhaGrid::kPerTile;
}

// The work order's sections (decode_tile in sm90/fmha/kernel.cuh), so that the K/V of the heads
// that concurrent CTAs work on fit in L2. Dense: how many (batch, head group) units share a
// section; only masked calls need the order across heads (their query tiles differ in cost),
// unmasked ones keep one unit per section, each head's tiles together. Varlen: query heads per
// section, whole KV heads' groups dividing Hq, sized for the longest sequence (seqlen_k is
// max_seqlen_k); each sequence's tiles are walked section by section.
inline int fmha_section_units(const FmhaCall& c, int pack_heads, int64_t element_size) {
  constexpr int64_t kL2Budget = 32 << 20;  // bytes of K/V in flight (H100: 50 MB of L2)
  const int64_t kv_head_bytes = 2 * c.seqlen_k * c.head_dim * element_size;
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

// Packed GQA (dense calls): the query heads that share a KV head fill a work tile's rows, so
// each K/V tile is read once per group rather than once per query head. A tile holds
// kBlockM / group tokens of the whole group (or kBlockM heads of one token when the group is at
// least kBlockM), so the group must divide kBlockM or be a multiple of it. It pays when the
// query tiles are mostly empty (decode, short queries): pack when the packed tiles are
// noticeably fuller. DSV4_FMHA_PACK_GQA=0|1 overrides the choice where packing is possible.
struct GqaPacking {
  int tokens, heads;  // query tokens and query heads per work tile
};

inline GqaPacking gqa_packing(const FmhaCall& c, int block_m) {
  const GqaPacking unpacked{block_m, 1};
  const int64_t group = c.heads_q / c.heads_kv;
  if (c.varlen || group == 1 || (block_m % group != 0 && group % block_m != 0)) return unpacked;
  const GqaPacking packed{static_cast<int>(std::max<int64_t>(1, block_m / group)),
                          static_cast<int>(std::min<int64_t>(group, block_m))};
  if (const char* forced = std::getenv("DSV4_FMHA_PACK_GQA")) {
    return std::strcmp(forced, "0") == 0 ? unpacked : packed;
  }
  auto fill = [&](int64_t tokens) {  // valid rows per row of the query tiles
    return double(c.seqlen_q) / double((c.seqlen_q + tokens - 1) / tokens * tokens);
  };
  return fill(unpacked.tokens) < 0.9 * fill(packed.tokens) ? packed : unpacked;
}

// Keys per tile at head_dim 128 (the other head dims have one choice). 176 keys per tile
// measured 1-7% faster than 128 on long full rows; under a causal mask or a window, 128 wastes
// less of the diagonal tiles and leaves the consumers 36 registers, as FlashAttention-3 also
// chooses (benchmarks/NOTES.md has the same-run timings). Varlen calls take 128 always (176
// measured no faster on the varlen rows, and its varlen kernel spilled). For dense calls
// DSV4_FMHA_D128_BLOCK_N=128|176 overrides the choice, for tests and timing.
inline int fmha_d128_block_n(const FmhaCall& c) {
  if (c.varlen) return 128;
  if (const char* forced = std::getenv("DSV4_FMHA_D128_BLOCK_N")) {
    TORCH_CHECK(std::strcmp(forced, "128") == 0 || std::strcmp(forced, "176") == 0,
                "fmha: DSV4_FMHA_D128_BLOCK_N must be 128 or 176, got '", forced, "'");
    return std::atoi(forced);
  }
  return c.causal || c.window_left >= 0 ? 128 : 176;
}

// The head_dim-128 kernels with 128 keys per tile, dense and varlen, in a translation unit of
// their own (sm90/fmha/launch_d128_n128.cu) so that they compile in parallel with the others.
void fmha_sm90_d128_n128(const FmhaCall& c, at::Tensor& out, at::Tensor& lse);

template <typename Element, int kHeadDim, int kBlockN, bool kVarlen>
void launch(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  using T = FmhaSm90Traits<Element, kHeadDim, kBlockN>;
  constexpr auto kernel = fmha_sm90_kernel<Element, kHeadDim, kBlockN, kVarlen>;
  allow_dynamic_smem<kernel>(c.q.get_device(), T::kSmemBytes);
  const GqaPacking pack = gqa_packing(c, T::kBlockM);
  const CUtensorMap tq =
      make_tensor_map_bshd("fmha", as_bshd(c, c.q), "q", pack.tokens, pack.heads);
  const CUtensorMap tk = make_tensor_map_bshd("fmha", as_bshd(c, c.k), "k", T::kBlockN);
  const CUtensorMap tv = make_tensor_map_bshd("fmha", as_bshd(c, c.v), "v", T::kBlockN);

  FmhaSm90Params p;
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.sinks = c.sinks ? c.sinks->data_ptr<float>() : nullptr;
  p.batch = static_cast<int>(c.batch);
  p.seqlen_q = static_cast<int>(c.seqlen_q);
  p.seqlen_k = static_cast<int>(c.seqlen_k);
  p.heads_q = static_cast<int>(c.heads_q);
  p.group = static_cast<int>(c.heads_q / c.heads_kv);
  p.pack_tokens = pack.tokens;
  p.pack_heads = pack.heads;
  p.num_m_blocks = static_cast<int>((c.seqlen_q + pack.tokens - 1) / pack.tokens);
  p.scale_log2 = static_cast<float>(c.scale * 1.4426950408889634);
  p.causal = c.causal ? 1 : 0;
  p.window_left = static_cast<int>(c.window_left);
  p.num_work = p.num_m_blocks * (p.heads_q / p.pack_heads) * p.batch;
  p.section_units = fmha_section_units(c, pack.heads, sizeof(Element));
  p.tile_counter = nullptr;
  p.varlen_tiles = nullptr;
  p.varlen_sequences = nullptr;
  p.num_splits = 1;
  p.o_partial = p.lse_partial = nullptr;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int num_sms = device_info(c.q.get_device()).num_sms;
  at::Tensor split_workspace;  // split-KV partials, alive until the combine is queued
  VarlenScheduleBuffers schedule;     // alive until the kernel is queued
  if constexpr (kVarlen) {
    schedule = build_varlen_schedule(*c.cu_seqlens_q, *c.cu_seqlens_k, c.q.size(0), c.k.size(0),
                                     T::kBlockM, T::kBlockN, c.causal, c.window_left, nullptr, 0,
                                     p.heads_q / p.section_units, p.section_units);
    p.batch = 1;
    p.seqlen_q = static_cast<int>(c.q.size(0));
    p.seqlen_k = static_cast<int>(c.k.size(0));
    p.num_m_blocks = 0;
    p.num_work = static_cast<int>(schedule.capacity * c.heads_q);
    p.varlen_tiles = schedule.tiles;
    p.varlen_sequences = schedule.sequences;
  } else {
    // Split-KV when the work tiles cannot fill the SMs (decode, short queries): the plan
    // reads shapes only. A work tile sees at most Sk keys, fewer under a window.
    const int64_t key_tiles = (c.seqlen_k + T::kBlockN - 1) / T::kBlockN;
    const int64_t max_key_tiles =
        c.window_left >= 0
            ? std::min(key_tiles, (c.window_left + T::kBlockM + T::kBlockN - 1) / T::kBlockN + 1)
            : key_tiles;
    p.num_splits = split_kv_plan(p.num_work, max_key_tiles, num_sms);
    if (p.num_splits > 1) {
      const int64_t rows = c.batch * c.seqlen_q * c.heads_q;
      split_workspace = split_kv_workspace(p.num_splits, rows, kHeadDim, c.q);
      p.o_partial = split_workspace.data_ptr<float>();
      p.lse_partial = p.o_partial + p.num_splits * rows * kHeadDim;
    }
  }

  const int64_t num_work = int64_t(p.num_work) * p.num_splits;
  const FmhaGrid grid_kind = fmha_grid(c, T::kPublishWorkTiles, kBlockN);
  const dim3 grid(static_cast<unsigned>(
      grid_kind == FmhaGrid::kPerTile ? num_work : std::min<int64_t>(num_work, num_sms)));
  at::Tensor tile_counter;  // alive until the kernel is queued
  if (grid_kind == FmhaGrid::kDynamic && num_work > num_sms) {
    tile_counter = at::zeros({1}, c.q.options().dtype(at::kInt));
    p.tile_counter = tile_counter.data_ptr<int>();
  }
  p.num_work = static_cast<int>(num_work);
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(tq, tk, tv, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (p.num_splits > 1) {
    launch_split_kv_combine<Element, kHeadDim>(p, out.data_ptr(), lse.data_ptr<float>(), stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// Every head_dim and element type of one kind of call (dense or varlen).
template <bool kVarlen>
void dispatch(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  switch (c.head_dim) {
    case 64:
      return bf16 ? launch<__nv_bfloat16, 64, 128, kVarlen>(c, out, lse)
                  : launch<__half, 64, 128, kVarlen>(c, out, lse);
    case 128:
      if constexpr (kVarlen) {
        return fmha_sm90_d128_n128(c, out, lse);
      } else {
        if (fmha_d128_block_n(c) == 128) return fmha_sm90_d128_n128(c, out, lse);
        return bf16 ? launch<__nv_bfloat16, 128, 176, false>(c, out, lse)
                    : launch<__half, 128, 176, false>(c, out, lse);
      }
    case 256:
      return bf16 ? launch<__nv_bfloat16, 256, 80, kVarlen>(c, out, lse)
                  : launch<__half, 256, 80, kVarlen>(c, out, lse);
    default:
      TORCH_CHECK(false, "fmha: the sm90 kernel has no head_dim ", c.head_dim);
  }
}

void fmha_sm90_varlen(const FmhaCall& c, at::Tensor& out, at::Tensor& lse);

}  // namespace dsv4
