// The DSV4_* environment overrides of the launch plans, for tests and timing. They are read in
// one place (overrides.cpp: nothing else under csrc/ reads the environment), once per op call,
// so a test may change them between calls. A malformed value is an error naming the variable.
#pragma once

namespace dsv4 {

enum class FmhaGridOverride { kAuto, kPerTile, kPersistent, kDynamic };

struct Overrides {
  bool disable_sm90 = false;     // DSV4_DISABLE_SM90=1: every op takes the reference path
  int plan_assume_sm90_sms = 0;  // DSV4_PLAN_ASSUME_SM90=N: the _plan ops plan for an sm_90
                                 // device of N SMs whatever the tensors' device (no GPU needed)
  int split_kv = 0;              // DSV4_SPLIT_KV=N: N key splits (capped by the key tiles); 0: planned
  FmhaGridOverride fmha_grid = FmhaGridOverride::kAuto;  // DSV4_FMHA_GRID=per_tile|persistent|dynamic
  int fmha_pack_gqa = -1;        // DSV4_FMHA_PACK_GQA=0|1 where packing is possible; -1: planned
  int fmha_d128_block_n = 0;     // DSV4_FMHA_D128_BLOCK_N=128|176, dense head_dim-128 calls; 0: planned
  bool mqa512_per_tile_grid = false;  // DSV4_MQA512_GRID=per_tile|persistent (default persistent)
  int mqa512_narrow = -1;        // DSV4_MQA512_NARROW=0|1: CSA at <= 16 heads per KV head in the
                                 // narrow form never, or wherever it fits; -1: planned
  int mqa512_paged_convert = -1;  // DSV4_MQA512_PAGED_CONVERT=producer|consumer: who converts a
                                  // paged call's FP8 blocks; -1: planned
  int mqa512_split_merge = -1;   // DSV4_MQA512_SPLIT_MERGE=combine|cluster: how a split call's
                                 // splits meet (cluster: wherever it fits); -1: planned
  int chunk_segments = 0;        // DSV4_CHUNK_SEGMENTS=N: N segments per sequence (1: unsplit); 0: planned
  int chunk_fused = -1;          // DSV4_CHUNK_FUSED=0|1, unsplit dense delta-rule calls; -1: planned
  bool chunk_warmups = true;     // DSV4_CHUNK_WARMUP=0: every head through the exact combine
  int indexer_topk_warp = -1;    // DSV4_INDEXER_TOPK=warp|cta where a warp's list fits; -1: planned
};

Overrides read_overrides();

}  // namespace dsv4
