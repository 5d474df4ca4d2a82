#include "sm90/shared/overrides.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace dsv4 {
namespace {

// A whole decimal integer >= lo, or an error naming the variable.
int parse_int(const char* name, const char* value, int lo) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  TORCH_CHECK(*value != '\0' && *end == '\0' && v >= lo && v <= (1 << 30), "dsv4: ", name,
              " must be an integer >= ", lo, ", got '", value, "'");
  return static_cast<int>(v);
}

// One of `choices` (its index), or an error naming the variable and the choices.
int parse_choice(const char* name, const char* value, std::initializer_list<const char*> choices,
                 const char* expected) {
  int i = 0;
  for (const char* c : choices) {
    if (std::strcmp(value, c) == 0) return i;
    ++i;
  }
  TORCH_CHECK(false, "dsv4: ", name, " must be ", expected, ", got '", value, "'");
}

}  // namespace

Overrides read_overrides() {
  Overrides o;
  if (const char* v = std::getenv("DSV4_DISABLE_SM90")) o.disable_sm90 = v[0] == '1';
  if (const char* v = std::getenv("DSV4_PLAN_ASSUME_SM90")) {
    o.plan_assume_sm90_sms = parse_int("DSV4_PLAN_ASSUME_SM90", v, 1);
  }
  if (const char* v = std::getenv("DSV4_SPLIT_KV")) o.split_kv = parse_int("DSV4_SPLIT_KV", v, 1);
  if (const char* v = std::getenv("DSV4_FMHA_GRID")) {
    o.fmha_grid = static_cast<FmhaGridOverride>(
        1 + parse_choice("DSV4_FMHA_GRID", v, {"per_tile", "persistent", "dynamic"},
                         "per_tile, persistent or dynamic"));
  }
  if (const char* v = std::getenv("DSV4_FMHA_PACK_GQA")) {
    o.fmha_pack_gqa = parse_choice("DSV4_FMHA_PACK_GQA", v, {"0", "1"}, "0 or 1");
  }
  if (const char* v = std::getenv("DSV4_FMHA_D128_BLOCK_N")) {
    o.fmha_d128_block_n =
        parse_choice("DSV4_FMHA_D128_BLOCK_N", v, {"128", "176"}, "128 or 176") == 0 ? 128 : 176;
  }
  if (const char* v = std::getenv("DSV4_MQA512_GRID")) {
    o.mqa512_per_tile_grid =
        parse_choice("DSV4_MQA512_GRID", v, {"persistent", "per_tile"}, "persistent or per_tile") == 1;
  }
  if (const char* v = std::getenv("DSV4_MQA512_NARROW")) {
    o.mqa512_narrow = parse_choice("DSV4_MQA512_NARROW", v, {"0", "1"}, "0 or 1");
  }
  if (const char* v = std::getenv("DSV4_MQA512_PAGED_CONVERT")) {
    o.mqa512_paged_convert = parse_choice("DSV4_MQA512_PAGED_CONVERT", v,
                                          {"producer", "consumer"}, "producer or consumer");
  }
  if (const char* v = std::getenv("DSV4_MQA512_SPLIT_MERGE")) {
    o.mqa512_split_merge = parse_choice("DSV4_MQA512_SPLIT_MERGE", v, {"combine", "cluster"},
                                        "combine or cluster");
  }
  if (const char* v = std::getenv("DSV4_CHUNK_SEGMENTS")) {
    o.chunk_segments = parse_int("DSV4_CHUNK_SEGMENTS", v, 1);
  }
  if (const char* v = std::getenv("DSV4_CHUNK_FUSED")) {
    o.chunk_fused = parse_choice("DSV4_CHUNK_FUSED", v, {"0", "1"}, "0 or 1");
  }
  if (const char* v = std::getenv("DSV4_CHUNK_WARMUP")) {
    o.chunk_warmups = parse_choice("DSV4_CHUNK_WARMUP", v, {"0", "1"}, "0 or 1") == 1;
  }
  if (const char* v = std::getenv("DSV4_INDEXER_TOPK")) {
    o.indexer_topk_warp = parse_choice("DSV4_INDEXER_TOPK", v, {"cta", "warp"}, "cta or warp");
  }
  return o;
}

}  // namespace dsv4
