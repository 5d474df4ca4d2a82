// Host side of the sm90 head_dim-512 shared-KV kernel: which fmha and dsv4_attention calls it
// covers, the query-head packing, tensor maps from the tensors' real strides, and the launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "sm90/shared/split_kv.h"
#include "sm90/shared/split_kv_combine.cuh"
#include "sm90/shared/host.h"
#include "ops/dsv4_attention.h"
#include "ops/fmha.h"
#include "sm90/mqa512/kernel.cuh"

namespace dsv4 {
namespace {

constexpr int kRows = 64;  // Mqa512Sm90Traits::kBlockM, for either element type

// What both ops share: a dense call, q (B, Sq, Hq, 512), one KV head per `group` query heads.
struct Mqa512Shape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
};

bool covers_shape(const at::Tensor& q, const Mqa512Shape& s, int64_t head_dim, double scale) {
  if (!q.is_cuda() || sm90_disabled_by_env()) return false;
  if (!device_info(q.get_device()).is_sm90) return false;
  if (head_dim != 512 || !(scale > 0.0)) return false;  // the max is taken before scaling
  if (s.batch < 1 || s.seqlen_q < 1 || s.seqlen_k < 1 || s.heads_q < 1) return false;
  // The query heads of a KV head pack into 64-row tiles: 64 / group tokens, or group / 64 tiles.
  const int64_t group = s.heads_q / s.heads_kv;
  if (group % kRows != 0 && kRows % group != 0) return false;
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  const int64_t tile_tokens = kRows / std::min<int64_t>(group, kRows);
  const int64_t num_work = ((s.seqlen_q + tile_tokens - 1) / tile_tokens) *
                           std::max<int64_t>(group / kRows, 1) * s.heads_kv * s.batch;
  // The kernel carries a work-tile index in 27 bits (Mqa512Progress).
  return num_work < kMqa512MaxWork && s.seqlen_k <= kMaxInt - s.seqlen_q;
}

Mqa512Sm90Params make_params(const Mqa512Shape& s, double scale, at::Tensor& out,
                             at::Tensor& lse, const std::optional<at::Tensor>& sinks) {
  const int group = static_cast<int>(s.heads_q / s.heads_kv);
  Mqa512Sm90Params p{};
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.sinks = sinks ? sinks->data_ptr<float>() : nullptr;
  p.batch = static_cast<int>(s.batch);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.heads_q = static_cast<int>(s.heads_q);
  p.heads_kv = static_cast<int>(s.heads_kv);
  p.group = group;
  p.tile_heads = std::min(group, kRows);
  p.tile_tokens = kRows / p.tile_heads;
  p.head_blocks = group / p.tile_heads;
  p.num_m_blocks = static_cast<int>((s.seqlen_q + p.tile_tokens - 1) / p.tile_tokens);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.use_kv = 1;
  p.causal = 0;
  p.window_left = -1;
  p.compress_ratio = 0;
  p.seqlen_c = 0;
  p.topk = nullptr;
  p.topk_k = 0;
  p.compressed = nullptr;
  p.c_batch_stride = p.c_row_stride = 0;
  p.num_splits = 1;
  p.o_partial = p.lse_partial = nullptr;
  p.varlen_tiles = nullptr;
  p.varlen_sequences = nullptr;
  p.varlen_compressed = nullptr;
  return p;
}

// A persistent grid (one CTA per SM, stride over the work tiles, the costliest first) loads a
// tile's Q during the previous tile's last P V. Measured with the seesaw schedule, same runs:
// causal fmha S = 4k Hq = 64 1.5-3% faster than one CTA per work tile, S = 8k Hq = 128 within
// noise; dsv4_attention's short window-bounded tiles gain most (sliding S = 8k Hq = 128 1.91 ->
// 1.72 ms, earlier kernel). DSV4_MQA512_GRID=per_tile launches one CTA per work tile instead,
// for timing the variants.
bool use_persistent_grid() {
  const char* grid = std::getenv("DSV4_MQA512_GRID");
  return grid == nullptr || std::strcmp(grid, "per_tile") != 0;
}

template <typename Element>
void launch(const char* op, Mqa512Sm90Params p, const at::Tensor& q, const at::Tensor& kv,
            const at::Tensor& compressed, int64_t max_key_tiles, at::Tensor& out,
            at::Tensor& lse) {
  using T = Mqa512Sm90Traits<Element>;
  static_assert(T::kBlockM == kRows, "packing assumes 64-row tiles");
  constexpr auto kernel = mqa512_sm90_kernel<Element>;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int num_sms = device_info(q.get_device()).num_sms;
  const int64_t tiles = int64_t(p.num_m_blocks) * p.head_blocks * p.heads_kv * p.batch;
  // Splits only where the work tiles are few; a forced count stays within the work-tile bound.
  p.num_splits = static_cast<int>(std::min<int64_t>(split_kv_plan(tiles, max_key_tiles, num_sms),
                                                    (kMqa512MaxWork - 1) / std::max<int64_t>(tiles, 1)));
  at::Tensor split_workspace;  // split-KV partials, alive until the combine is queued
  if (p.num_splits > 1) {
    const int64_t rows = int64_t(p.batch) * p.seqlen_q * p.heads_q;
    split_workspace = split_kv_workspace(p.num_splits, rows, T::kHeadDim, q);
    p.o_partial = split_workspace.data_ptr<float>();
    p.lse_partial = p.o_partial + p.num_splits * rows * T::kHeadDim;
  }
  allow_dynamic_smem<kernel>(q.get_device(), T::kSmemBytes);
  const CUtensorMap tq = make_tensor_map_bshd(op, q, "q", p.tile_tokens, p.tile_heads);
  const CUtensorMap tkv = make_tensor_map_bshd(op, kv, "kv", T::kBlockN);
  const CUtensorMap tc = compressed.defined()
                             ? make_tensor_map_bshd(op, compressed, "compressed_kv", T::kBlockN)
                             : tkv;  // not read without compressed rows
  const int64_t num_work = tiles * p.num_splits;
  p.num_work = static_cast<int>(num_work);
  const int64_t grid = use_persistent_grid() ? std::min<int64_t>(num_work, num_sms) : num_work;
  kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream>>>(tq, tkv, tc, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (p.num_splits > 1) {
    launch_split_kv_combine<Element, T::kHeadDim>(p, out.data_ptr(), lse.data_ptr<float>(), stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// max_key_tiles: an upper bound on the key tiles of one work tile, for the split-KV plan.
void dispatch(const char* op, const Mqa512Sm90Params& p, const at::Tensor& q, const at::Tensor& kv,
              const at::Tensor& compressed, int64_t max_key_tiles, at::Tensor& out,
              at::Tensor& lse) {
  if (q.scalar_type() == at::kBFloat16) {
    launch<__nv_bfloat16>(op, p, q, kv, compressed, max_key_tiles, out, lse);
  } else {
    launch<__half>(op, p, q, kv, compressed, max_key_tiles, out, lse);
  }
}

constexpr int64_t kKeysPerTile = 64;
int64_t tiles_of(int64_t keys) { return (keys + kKeysPerTile - 1) / kKeysPerTile; }

// Varlen: the longest sequences stand in for Sq and Sk.
Mqa512Shape shape_of(const FmhaCall& c) {
  return {c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv};
}


// dsv4_attention's kv (B, Skv, D) and compressed_kv (B, Sc, D) as (B, S, 1, D) views.
at::Tensor one_head(const at::Tensor& t) { return t.unsqueeze(2); }

Mqa512Shape shape_of(const Dsv4Call& c) {
  return {c.batch, c.seqlen_q, c.seqlen_kv, c.heads, 1};
}

}  // namespace

// ---- fmha: D = Dv = 512, k and v one tensor (the same memory with the same geometry).
bool mqa512_sm90_covers(const FmhaCall& c) {
  if (c.head_dim_v != 512) return false;
  if (c.k.data_ptr() != c.v.data_ptr() || c.k.sizes() != c.v.sizes() ||
      c.k.strides() != c.v.strides()) {
    return false;
  }
  if (c.varlen) {
    // Packed rows (plus a tile past the end) are int; an empty q or k has no memory to
    // describe. The schedule's slots bound the work tiles: check them as Sq of one sequence.
    constexpr int64_t kMaxRows = std::numeric_limits<int>::max() / 2;
    const int64_t total_q = c.q.size(0), total_k = c.k.size(0);
    if (total_q < 1 || total_k < 1 || total_q > kMaxRows || total_k > kMaxRows) return false;
    if (c.heads_q < 1 || c.heads_kv < 1) return false;
    const int64_t group = c.heads_q / c.heads_kv;
    const int64_t slots = varlen_tile_capacity(total_q, c.batch, kRows / std::min<int64_t>(group, kRows));
    const Mqa512Shape as_one{1, slots * (kRows / std::min<int64_t>(group, kRows)), total_k,
                             c.heads_q, c.heads_kv};
    if (!covers_shape(c.q, as_one, c.head_dim, c.scale)) return false;
  } else if (!covers_shape(c.q, shape_of(c), c.head_dim, c.scale)) {
    return false;
  }
  return tma_compatible(as_bshd(c, c.q)) && tma_compatible(as_bshd(c, c.k));
}

void mqa512_sm90(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  Mqa512Sm90Params p = make_params(shape_of(c), c.scale, out, lse, c.sinks);
  p.causal = c.causal ? 1 : 0;
  p.window_left = static_cast<int>(c.window_left);
  VarlenScheduleBuffers schedule;  // alive until the kernel is queued
  if (c.varlen) {
    schedule = build_varlen_schedule(*c.cu_seqlens_q, *c.cu_seqlens_k, c.q.size(0), c.k.size(0),
                                     p.tile_tokens, static_cast<int>(kKeysPerTile), c.causal,
                                     c.window_left);
    p.batch = 1;
    p.seqlen_q = static_cast<int>(c.q.size(0));
    p.seqlen_k = static_cast<int>(c.k.size(0));
    p.num_m_blocks = static_cast<int>(schedule.capacity);
    p.varlen_tiles = schedule.tiles;
    p.varlen_sequences = schedule.sequences;
  }
  const int64_t max_key_tiles =
      c.window_left >= 0 ? std::min(tiles_of(c.seqlen_k), tiles_of(c.window_left + 64) + 1)
                         : tiles_of(c.seqlen_k);
  dispatch("fmha", p, as_bshd(c, c.q), as_bshd(c, c.k), at::Tensor(), max_key_tiles, out, lse);
}

// ---- dsv4_attention: sliding-only, HCA and CSA layers, dense or varlen. CSA gathers per
// token, so it needs one token per tile: a multiple of 64 query heads.
namespace {

// Varlen tensors as one batch: q (1, total_q, Hq, D), kv and compressed_kv (1, total, 1, D).
at::Tensor q_bshd(const Dsv4Call& c) { return c.varlen ? c.q.unsqueeze(0) : c.q; }
at::Tensor rows_bshd(const Dsv4Call& c, const at::Tensor& t) {
  return c.varlen ? one_head(t.unsqueeze(0)) : one_head(t);
}
// Compressed rows that exist: dense Sc > 0, varlen total_c > 0.
bool has_compressed(const Dsv4Call& c) {
  return c.compressed_kv.has_value() &&
         (c.varlen ? c.compressed_kv->size(0) > 0 : c.seqlen_compressed > 0);
}

}  // namespace

bool mqa512_sm90_covers(const Dsv4Call& c) {
  if (c.topk_indices.has_value() && c.heads % kRows != 0) return false;
  if (c.q.scalar_type() != at::kBFloat16 && c.q.scalar_type() != at::kHalf) return false;
  if (c.varlen) {
    // Packed rows (plus a tile past the end) are int; an empty q or kv has no memory to
    // describe. The schedule's slots bound the work tiles: check them as Sq of one sequence.
    constexpr int64_t kMaxRows = std::numeric_limits<int>::max() / 2;
    const int64_t total_q = c.q.size(0), total_kv = c.kv.size(0);
    const int64_t total_c = c.compressed_kv ? c.compressed_kv->size(0) : 0;
    if (total_q < 1 || total_kv < 1 || total_q > kMaxRows || total_kv > kMaxRows) return false;
    if (total_c > kMaxRows || c.heads < 1) return false;
    const int64_t tile_tokens = kRows / std::min<int64_t>(c.heads, kRows);
    const int64_t slots = varlen_tile_capacity(total_q, c.batch, static_cast<int>(tile_tokens));
    if (!covers_shape(c.q, {1, slots * tile_tokens, total_kv, c.heads, 1}, c.head_dim, c.scale)) {
      return false;
    }
  } else if (!covers_shape(c.q, shape_of(c), c.head_dim, c.scale)) {
    return false;
  }
  if (!tma_compatible(q_bshd(c)) || !tma_compatible(rows_bshd(c, c.kv))) return false;
  if (has_compressed(c) && !tma_compatible(rows_bshd(c, *c.compressed_kv))) return false;
  // The CSA gather offsets rows by a 32-bit byte stride.
  if (c.topk_indices.has_value() && has_compressed(c)) {
    const int64_t row_bytes =
        c.compressed_kv->stride(c.varlen ? 0 : 1) * c.compressed_kv->element_size();
    if (row_bytes >= (int64_t{1} << 32)) return false;
  }
  return true;
}

void mqa512_sm90(const Dsv4Call& c, at::Tensor& out, at::Tensor& lse) {
  Mqa512Sm90Params p = make_params(shape_of(c), c.scale, out, lse, c.sinks);
  // The window W: kv rows t - W < j <= t, fmha's causal mask with window_left W - 1.
  p.use_kv = c.window > 0 ? 1 : 0;
  p.causal = 1;
  p.window_left = static_cast<int>(std::max<int64_t>(c.window - 1, 0));
  const bool has_c = has_compressed(c);
  at::Tensor topk;  // kept alive until the launch
  if (has_c) {
    p.compress_ratio = static_cast<int>(c.compress_ratio);
    p.seqlen_c = static_cast<int>(c.varlen ? c.compressed_kv->size(0) : c.seqlen_compressed);
    if (c.topk_indices) {
      topk = c.topk_indices->contiguous();
      p.topk = topk.data_ptr<int>();
      p.topk_k = static_cast<int>(c.topk);
      p.compressed = c.compressed_kv->data_ptr();
      p.c_batch_stride = c.varlen ? 0 : c.compressed_kv->stride(0);
      p.c_row_stride = c.compressed_kv->stride(c.varlen ? 0 : 1);
    }
  }
  VarlenScheduleBuffers schedule;  // alive until the kernel is queued
  if (c.varlen) {
    schedule = build_varlen_schedule(*c.cu_seqlens_q, *c.cu_seqlens_kv, c.q.size(0), c.kv.size(0),
                                     p.tile_tokens, static_cast<int>(kKeysPerTile), true,
                                     p.window_left, has_c ? &*c.cu_seqlens_compressed : nullptr,
                                     has_c ? c.compressed_kv->size(0) : 0);
    p.batch = 1;
    p.seqlen_q = static_cast<int>(c.q.size(0));
    p.seqlen_k = static_cast<int>(c.kv.size(0));
    p.num_m_blocks = static_cast<int>(schedule.capacity);
    p.varlen_tiles = schedule.tiles;
    p.varlen_sequences = schedule.sequences;
    p.varlen_compressed = schedule.rows_c;
  }
  // Split-KV plan bound (shapes only): the window's tiles and the compressed rows one query
  // can see, at most (longest kv) / r of them for HCA.
  int64_t max_key_tiles = std::min(tiles_of(c.seqlen_kv), tiles_of(c.window + 64) + 1);
  if (has_c) {
    max_key_tiles += c.topk_indices ? tiles_of(c.topk)
                     : c.varlen      ? tiles_of(c.seqlen_kv / c.compress_ratio)
                                     : tiles_of(c.seqlen_compressed);
  }
  dispatch("dsv4_attention", p, q_bshd(c), rows_bshd(c, c.kv),
           has_c && !c.topk_indices ? rows_bshd(c, *c.compressed_kv) : at::Tensor(), max_key_tiles,
           out, lse);
}

}  // namespace dsv4
