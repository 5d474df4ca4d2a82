// dsv4_attention_paged: validate every input, then run the head_dim-512 family's paged mode
// (csrc/sm90/mqa512: the producer gathers and dequantizes the listed FP8 rows) when its route
// takes the call, else the reference path: ATen ops in fp32 on any device. The reference path
// processes tokens in blocks; each block dequantizes the rows its lists may read (through
// kv_cache_gather_fp8, slots not read as -1), masks the rest to -inf, and runs one fp32 softmax
// with the sink. Neither reads a value back to the host.
#include "ops/dsv4_attention_paged.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/checks.h"
#include "ops/kv_cache_fp8.h"
#include "sm90/kv_cache/format.h"
#include "sm90/mqa512/api.h"

namespace dsv4 {
namespace {

constexpr const char* kOp = "dsv4_attention_paged";

// fp32 elements the dequantized rows and scores of one block of tokens may take (256 MiB).
constexpr int64_t kBlockElems = int64_t(1) << 26;

// One slot list: slots (T, L) int32 and lengths (T,) int32, both on q's device.
void check_list(const at::Tensor& q, const char* slots_name, const at::Tensor& slots,
                const char* lengths_name, const std::optional<at::Tensor>& lengths) {
  check_defined(kOp, slots_name, slots);
  check_same_device(kOp, slots_name, slots, "q", q);
  check_dtype(kOp, slots_name, slots, at::kInt);
  check_dim(kOp, slots_name, slots, 2, "(T, L) of global slots");
  check_size(kOp, slots_name, slots, 0, q.size(0), "one list per query token");
  if (!lengths) return;
  check_defined(kOp, lengths_name, *lengths);
  check_same_device(kOp, lengths_name, *lengths, "q", q);
  check_dtype(kOp, lengths_name, *lengths, at::kInt);
  check_dim(kOp, lengths_name, *lengths, 1, "(T,)");
  check_size(kOp, lengths_name, *lengths, 0, q.size(0), "one length per query token");
}

// The slots of tokens [t0, t0 + R) of one list that are read, as int64 (R, L), -1 elsewhere.
at::Tensor slots_read(const at::Tensor& cache, const at::Tensor& slots,
                      const std::optional<at::Tensor>& lengths, int64_t t0, int64_t R) {
  const at::Tensor s = slots.narrow(0, t0, R).to(at::kLong);
  at::Tensor read = (s >= 0) & (s < cache.size(0) * cache.size(1));
  if (lengths) {
    const at::Tensor entry = at::arange(s.size(1), s.options()).view({1, -1});
    read = read & (entry < lengths->narrow(0, t0, R).to(at::kLong).view({R, 1}));
  }
  return at::where(read, s, at::full({}, -1, s.options()));
}

// The rows of `slots` dequantized to fp32 (R, L, 512); zeros where the slot is -1.
at::Tensor dequantized_rows(const at::Tensor& cache, const at::Tensor& slots) {
  const int64_t R = slots.size(0), L = slots.size(1);
  const KvCacheCall gather{at::Tensor(), cache, slots.reshape({R * L}), at::kFloat};
  return kv_cache_gather_fp8(gather).view({R, L, kKvDims});
}

void reference(const Dsv4PagedCall& c, at::Tensor& lse) {
  const int64_t T = c.tokens, H = c.heads, D = kKvDims;
  const bool has_c = c.compressed_cache.has_value();
  const int64_t L = c.window_slots.size(1) + (has_c ? c.compressed_slots->size(1) : 0);
  const int64_t block = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(1, L * (D + 3 * H)));
  const auto fopts = c.q.options().dtype(at::kFloat);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const at::Tensor sink = c.sinks ? c.sinks->view({1, H}) : at::Tensor();
  at::Tensor lse_rows = at::empty({T, H}, fopts);

  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t R = std::min(block, T - t0);
    at::Tensor slots = slots_read(c.window_cache, c.window_slots, c.window_lengths, t0, R);
    at::Tensor keys = dequantized_rows(c.window_cache, slots);
    at::Tensor valid = slots >= 0;
    if (has_c) {
      const at::Tensor cs = slots_read(*c.compressed_cache, *c.compressed_slots,
                                       c.compressed_lengths, t0, R);
      keys = at::cat({keys, dequantized_rows(*c.compressed_cache, cs)}, 1);
      valid = at::cat({valid, cs >= 0}, 1);
    }
    const at::Tensor qf = c.q.narrow(0, t0, R).to(at::kFloat);            // (R, H, D)
    at::Tensor s = at::bmm(qf, keys.transpose(1, 2)).mul_(c.scale);        // (R, H, L)
    s.masked_fill_(valid.logical_not().view({R, 1, L}), neg_inf);
    const at::Tensor key_lse = L > 0 ? at::logsumexp(s, -1) : at::full({R, H}, neg_inf, fopts);
    const at::Tensor z = c.sinks ? at::logaddexp(key_lse, sink) : key_lse;
    // Nothing visible and no sink: z = -inf; shift by 0 so p = 0, not NaN. A sink of +inf
    // gives z = +inf and p = 0: out = 0.
    const at::Tensor shift = at::where(z == neg_inf, at::zeros({}, fopts), z);
    const at::Tensor p = at::exp(s - shift.unsqueeze(-1));
    c.out.narrow(0, t0, R).copy_(at::bmm(p, keys));
    lse_rows.narrow(0, t0, R).copy_(key_lse);
  }
  lse.copy_(lse_rows.t());
}

Mqa512Problem mqa512_problem(const Dsv4PagedCall& c) {
  Mqa512Problem p;
  p.op = kOp;
  p.q = c.q.unsqueeze(0);  // one batch of T tokens
  p.sinks = c.sinks;
  p.paged[0] = {c.window_cache, c.window_slots, c.window_lengths};
  p.num_paged = 1;
  if (c.compressed_cache) {
    p.paged[1] = {*c.compressed_cache, *c.compressed_slots, c.compressed_lengths};
    p.num_paged = 2;
  }
  Mqa512Shape& s = p.shape;
  s.batch = 1;
  s.seqlen_q = s.seqlen_k = s.longest_k = c.tokens;
  s.heads_q = c.heads;
  s.heads_kv = 1;
  s.scale = c.scale;
  s.use_kv = false;
  for (int i = 0; i < p.num_paged; ++i) {
    s.paged_tiles += (p.paged[i].slots.size(1) + kMqa512KeysPerTile - 1) / kMqa512KeysPerTile;
  }
  return p;
}

struct PagedDispatch {
  Mqa512Problem problem;
  Route<Mqa512Plan> route;
};

PagedDispatch dispatch(const Dsv4PagedCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  PagedDispatch d{mqa512_problem(c), {}};
  d.route = route_mqa512(d.problem, device_facts(c.q, overrides, for_plan), overrides);
  return d;
}

}  // namespace

Dsv4PagedCall check_dsv4_paged_inputs(const at::Tensor& q, const at::Tensor& window_cache,
                                      const at::Tensor& window_slots,
                                      const std::optional<at::Tensor>& window_lengths,
                                      const std::optional<at::Tensor>& compressed_cache,
                                      const std::optional<at::Tensor>& compressed_slots,
                                      const std::optional<at::Tensor>& compressed_lengths,
                                      const std::optional<at::Tensor>& sinks,
                                      std::optional<double> scale, const at::Tensor& out) {
  check_defined(kOp, "q", q);
  check_half_dtype(kOp, "q", q);
  check_dim(kOp, "q", q, 3, "(T, Hq, 512)");
  check_size(kOp, "q", q, 2, kKvDims, "head_dim");
  TORCH_CHECK(q.size(1) >= 1, kOp, ": q must have at least one head (got shape ", shape_str(q), ")");
  check_last_dim_contiguous(kOp, "q", q);
  check_defined(kOp, "out", out);
  check_same_device(kOp, "out", out, "q", q);
  check_same_dtype(kOp, "out", out, "q", q);
  TORCH_CHECK(out.sizes() == q.sizes() && out.is_contiguous(), kOp,
              ": out must be a contiguous tensor of q's shape ", shape_str(q), " (got shape ",
              shape_str(out), ", strides ", out.strides(), ")");
  check_kv_cache(kOp, "window_cache", window_cache);
  check_same_device(kOp, "window_cache", window_cache, "q", q);
  check_list(q, "window_slots", window_slots, "window_lengths", window_lengths);
  TORCH_CHECK(compressed_cache.has_value() == compressed_slots.has_value(), kOp,
              ": compressed_cache and compressed_slots go together (got ",
              compressed_cache ? "compressed_cache without compressed_slots"
                               : "compressed_slots without compressed_cache", ")");
  TORCH_CHECK(!compressed_lengths || compressed_slots, kOp,
              ": compressed_lengths needs compressed_slots (got compressed_lengths alone)");
  if (compressed_cache) {
    check_kv_cache(kOp, "compressed_cache", *compressed_cache);
    check_same_device(kOp, "compressed_cache", *compressed_cache, "q", q);
    check_list(q, "compressed_slots", *compressed_slots, "compressed_lengths", compressed_lengths);
  }
  if (sinks) {
    check_defined(kOp, "sinks", *sinks);
    check_same_device(kOp, "sinks", *sinks, "q", q);
    check_dtype(kOp, "sinks", *sinks, at::kFloat);
    TORCH_CHECK(sinks->dim() == 1 && sinks->size(0) == q.size(1), kOp,
                ": sinks must be (Hq,) = (", q.size(1), ",) (got shape ", shape_str(*sinks), ")");
  }
  check_scale(kOp, scale);
  Dsv4PagedCall c;
  c.q = q;
  c.out = out;
  c.window_cache = window_cache;
  c.window_slots = window_slots;
  c.window_lengths = window_lengths;
  c.compressed_cache = compressed_cache;
  c.compressed_slots = compressed_slots;
  c.compressed_lengths = compressed_lengths;
  c.sinks = sinks;
  c.tokens = q.size(0);
  c.heads = q.size(1);
  c.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(kKvDims)));
  return c;
}

at::Tensor dsv4_attention_paged(const Dsv4PagedCall& c) {
  c10::DeviceGuard guard(c.q.device());
  at::Tensor lse = at::empty({c.heads, c.tokens}, c.q.options().dtype(at::kFloat));
  if (c.tokens == 0) return lse;
  const PagedDispatch d = dispatch(c, false);
  if (d.route.sm90) {
    at::Tensor out = c.out.unsqueeze(0), lse_rows = lse.unsqueeze(0);  // (1, T, Hq, 512), (1, Hq, T)
    run_mqa512(d.problem, d.route.plan, out, lse_rows);
  } else {
    reference(c, lse);
  }
  return lse;
}

std::string dsv4_attention_paged_path(const Dsv4PagedCall& c) {
  return dispatch(c, false).route.sm90 ? "sm90" : "reference";
}

std::string dsv4_attention_paged_plan(const Dsv4PagedCall& c) {
  const PagedDispatch d = dispatch(c, true);
  return d.route.sm90 ? "sm90 " + describe(d.route.plan) : "reference: " + d.route.why_not;
}

}  // namespace dsv4
