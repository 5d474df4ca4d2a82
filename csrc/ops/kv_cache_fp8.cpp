// The paged FP8 KV cache ops: the sm90 kernels (csrc/sm90/kv_cache), and elsewhere the same
// arithmetic as ATen ops on the cache's bytes.
#include "ops/kv_cache_fp8.h"

#include <c10/core/DeviceGuard.h>

#include "ops/checks.h"
#include "sm90/kv_cache/format.h"

namespace dsv4 {

void check_kv_cache(const char* op, const char* name, const at::Tensor& cache) {
  check_defined(op, name, cache);
  check_dtype(op, name, cache, at::kByte);
  check_dim(op, name, cache, 4, "(num_blocks, P, 1, 584)");
  check_size(op, name, cache, 2, 1, "one KV head");
  check_size(op, name, cache, 3, kKvRecordBytes, "bytes per record");
  TORCH_CHECK(cache.size(0) >= 1 && cache.size(1) >= 1, op, ": ", name,
              " must hold at least one block of at least one row (got shape ", shape_str(cache),
              ")");
  TORCH_CHECK(cache.stride(3) == 1 && (cache.size(1) == 1 || cache.stride(1) == kKvRecordBytes), op,
              ": ", name, " must be a view of whole blocks, strides (block bytes, 584, any, 1) (got ",
              cache.strides(), ")");
  const int64_t need = kv_block_bytes(cache.size(1));
  TORCH_CHECK(cache.size(0) == 1 || (cache.stride(0) >= cache.size(1) * kKvRecordBytes &&
                                      cache.stride(0) % kKvDataBytes == 0),
              op, ": ", name, ".stride(0) (bytes per block) must be a multiple of 576 of at least P * 584 = ",
              cache.size(1) * kKvRecordBytes, " (", need, " when padded) (got ", cache.stride(0), ")");
}

namespace {

void check_cache(const char* op, const at::Tensor& cache, const at::Tensor& slots) {
  check_kv_cache(op, "cache", cache);
  check_defined(op, "slots", slots);
  check_same_device(op, "slots", slots, "cache", cache);
  TORCH_CHECK(slots.scalar_type() == at::kInt || slots.scalar_type() == at::kLong, op,
              ": slots must be int32 or int64 (got ", slots.scalar_type(), ")");
  check_dim(op, "slots", slots, 1, "(N,)");
}

// The cache's bytes as one flat tensor from block 0 on, and each valid slot's byte offsets.
at::Tensor flat_bytes(const at::Tensor& cache) {
  const int64_t span = (cache.size(0) - 1) * cache.stride(0) + cache.size(1) * kKvRecordBytes;
  return cache.as_strided({span}, {1}, cache.storage_offset());
}

struct SlotOffsets {
  at::Tensor valid;  // (N,) bool: 0 <= slot < num_blocks * P
  at::Tensor data;   // (N,) int64: the data row's first byte (0 where not valid)
  at::Tensor scale;  // (N,) int64: the scale row's first byte
};

SlotOffsets slot_offsets(const at::Tensor& cache, const at::Tensor& slots) {
  const int64_t rows = cache.size(1);
  const at::Tensor s = slots.to(at::kLong);
  SlotOffsets o;
  o.valid = (s >= 0) & (s < cache.size(0) * rows);
  const at::Tensor safe = at::where(o.valid, s, at::zeros({}, s.options()));
  const at::Tensor block = at::div(safe, rows, "floor"), row = safe - block * rows;
  o.data = block * cache.stride(0) + row * kKvDataBytes;
  o.scale = block * cache.stride(0) + rows * kKvDataBytes + row * kKvScaleBytes;
  return o;
}

at::Tensor byte_index(const at::Tensor& first, int64_t count) {
  return first.unsqueeze(1) + at::arange(count, first.options());
}

Route<KvCachePlan> route(const KvCacheCall& c, bool insert, bool for_plan) {
  const Overrides overrides = read_overrides();
  const DeviceFacts device = device_facts(c.cache, overrides, for_plan);
  return insert ? route_kv_cache_insert(c, device) : route_kv_cache_gather(c, device);
}

std::string plan_of(const Route<KvCachePlan>& r) {
  return r.sm90 ? "sm90 " + describe(r.plan) : "reference: " + r.why_not;
}

}  // namespace

KvCacheCall check_kv_cache_insert_inputs(const at::Tensor& kv, const at::Tensor& cache,
                                         const at::Tensor& slots) {
  constexpr const char* kOp = "kv_cache_insert_fp8";
  check_defined(kOp, "kv", kv);
  check_half_dtype(kOp, "kv", kv);
  check_dim(kOp, "kv", kv, 2, "(N, 512)");
  check_size(kOp, "kv", kv, 1, kKvDims, "head_dim");
  check_same_device(kOp, "cache", cache, "kv", kv);
  check_cache(kOp, cache, slots);
  check_size(kOp, "slots", slots, 0, kv.size(0), "one slot per kv row");
  return {kv, cache, slots, kv.scalar_type()};
}

KvCacheCall check_kv_cache_gather_inputs(const at::Tensor& cache, const at::Tensor& slots,
                                         at::ScalarType dtype) {
  constexpr const char* kOp = "kv_cache_gather_fp8";
  check_cache(kOp, cache, slots);
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat, kOp,
              ": dtype must be bf16, fp16 or fp32 (got ", dtype, ")");
  return {at::Tensor(), cache, slots, dtype};
}

void kv_cache_insert_fp8(const KvCacheCall& c) {
  c10::DeviceGuard guard(c.cache.device());
  if (const Route<KvCachePlan> r = route(c, true, false); r.sm90) {
    run_kv_cache_insert(c, r.plan);
    return;
  }
  if (c.slots.numel() == 0) return;
  // The reference path: the rows of valid slots (selecting them syncs a GPU), quantized as
  // format.h says, and their bytes written through a flat view of the cache.
  const SlotOffsets off = slot_offsets(c.cache, c.slots);
  const at::Tensor keep = at::nonzero(off.valid).squeeze(1);
  const int64_t n = keep.numel();
  if (n == 0) return;
  const at::Tensor kv = c.kv.index_select(0, keep);
  const at::Tensor tiles = kv.narrow(1, 0, kKvQuantDims).to(at::kFloat).reshape({n, kKvTiles, kKvTileDims});
  const at::Tensor v = at::clamp_min(tiles.abs().amax(-1), kKvAmaxFloor) / kKvFp8Max;
  const auto [mantissa, exponent] = at::frexp(v);  // v = m 2^k, m in [0.5, 1)
  const at::Tensor e = exponent - (mantissa == 0.5).to(at::kInt);  // ceil(log2 v)
  const at::Tensor scale = at::ldexp(at::ones_like(v), e);
  const at::Tensor fp8 = (tiles / scale.unsqueeze(-1)).to(at::kFloat8_e4m3fn).view(at::kByte);
  const at::Tensor rope = kv.narrow(1, kKvQuantDims, kKvDims - kKvQuantDims).to(at::kBFloat16);
  const at::Tensor data = at::cat({fp8.reshape({n, kKvQuantDims}),
                                   rope.contiguous().view(at::kByte)}, 1);
  const at::Tensor scales = at::cat({(e + 127).to(at::kByte),
                                     at::zeros({n, kKvScaleBytes - kKvTiles}, data.options())}, 1);
  at::Tensor flat = flat_bytes(c.cache);
  flat.index_put_({byte_index(off.data.index_select(0, keep), kKvDataBytes).flatten()},
                  data.flatten());
  flat.index_put_({byte_index(off.scale.index_select(0, keep), kKvScaleBytes).flatten()},
                  scales.flatten());
}

at::Tensor kv_cache_gather_fp8(const KvCacheCall& c) {
  c10::DeviceGuard guard(c.cache.device());
  const int64_t n = c.slots.size(0);
  if (const Route<KvCachePlan> r = route(c, false, false); r.sm90) {
    at::Tensor out = at::empty({n, kKvDims}, c.cache.options().dtype(c.out_dtype));
    run_kv_cache_gather(c, r.plan, out);
    return out;
  }
  if (n == 0) return at::empty({0, kKvDims}, c.cache.options().dtype(c.out_dtype));
  const SlotOffsets off = slot_offsets(c.cache, c.slots);
  const at::Tensor flat = flat_bytes(c.cache);
  const at::Tensor data = flat.index({byte_index(off.data, kKvDataBytes)});     // (N, 576)
  const at::Tensor scales = flat.index({byte_index(off.scale, kKvScaleBytes)});  // (N, 8)
  const at::Tensor e = scales.narrow(1, 0, kKvTiles).to(at::kInt) - 127;
  const at::Tensor fp8 = data.narrow(1, 0, kKvQuantDims).contiguous().view(at::kFloat8_e4m3fn);
  const at::Tensor quant = fp8.to(at::kFloat).reshape({n, kKvTiles, kKvTileDims}) *
                           at::ldexp(at::ones(e.sizes(), fp8.options().dtype(at::kFloat)), e).unsqueeze(-1);
  const at::Tensor rope = data.narrow(1, kKvQuantDims, kKvDataBytes - kKvQuantDims)
                              .contiguous().view(at::kBFloat16);
  const at::Tensor rows = at::cat({quant.reshape({n, kKvQuantDims}).to(c.out_dtype),
                                   rope.to(c.out_dtype)}, 1);
  return at::where(off.valid.unsqueeze(1), rows, at::zeros({}, rows.options()));
}

std::string kv_cache_insert_fp8_path(const KvCacheCall& c) {
  return route(c, true, false).sm90 ? "sm90" : "reference";
}
std::string kv_cache_insert_fp8_plan(const KvCacheCall& c) { return plan_of(route(c, true, true)); }
std::string kv_cache_gather_fp8_path(const KvCacheCall& c) {
  return route(c, false, false).sm90 ? "sm90" : "reference";
}
std::string kv_cache_gather_fp8_plan(const KvCacheCall& c) { return plan_of(route(c, false, true)); }

}  // namespace dsv4
