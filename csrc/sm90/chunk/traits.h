// Traits of the sm90 chunk kernel (csrc/sm90/chunk/kernel.cuh): its tiles, the register split,
// the shared storage, its mbarriers and named barriers, and the work item a CTA owns.
//
// Barriers per stage s (three stages; parity flips once per pass over the ring):
//   full[s]       producer arrive.expect_tx + TMA, and 32 cp.async arrivals  -> prep, chain
//   prep_full[s]  every prep thread after its writes of stage s              -> chain
//   empty[s]      every prep and chain thread after its last read of stage s -> producer
// Named barriers, each over one warpgroup's 128 threads (ChunkBarrier): the prep's, between
// its steps on a stage (l2norm, the fused inverse, the gates, T_u read before P overwrites it),
// and one per chain, around its o staging tile.
// Registers: producer 24 + prep 104 + two chains at 192 fill the 64K of a 512-thread CTA
// (ptxas, all six instantiations: no spills; at 184 the chain spills, at 88 the prep). The
// delta rule's chain fits 192 only because it waits for Y together with X (chain.cuh).
// Tokens past a chunk's end have g = beta = 0 (zero-filled), so they neither decay nor write
// the state, and their output rows are not stored; rows of the next varlen sequence that a TMA
// box may bring in are thereby ignored.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "sm90/chunk/params.h"
#include "sm90/chunk/tiles.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "sm90/shared/smem.cuh"

namespace dsv4 {

template <typename Element>
struct ChunkSm90Traits {
  static constexpr int kChunk = 64;   // tokens per chunk
  static constexpr int kDim = 128;    // K = V
  static constexpr int kBlockV = 64;  // v-columns per chain warpgroup
  static constexpr int kChains = kDim / kBlockV;  // chain warpgroups per CTA: a whole v-head
  static constexpr int kStages = 3;  // two left the chain waiting for loads and prep (6-9%)
  static constexpr int kThreads = 128 * (2 + kChains);
  static constexpr int kInvLd = 72;  // fp16 row stride of the fused inverse's tiles
  // setmaxnreg budget: 128 * (producer + prep + chains) <= 64K registers. Every warpgroup
  // starts at the __launch_bounds__ cap of 128; producer and prep give back what the chains take.
  static constexpr int kLaunchRegs = 65536 / kThreads;
  static constexpr int kProducerRegs = 24, kPrepRegs = 104, kChainRegs = 192;
  static_assert(128 * (kProducerRegs + kPrepRegs + kChains * kChainRegs) <= 65536,
                "register budget");
  static_assert(kPrepRegs <= kLaunchRegs && kChainRegs >= kLaunchRegs, "prep gives, chains take");
  static_assert(kChains * (kChainRegs - kLaunchRegs) <=
                    (kLaunchRegs - kProducerRegs) + (kLaunchRegs - kPrepRegs),
                "the chains take only what the producer and prep free");

  // Every [64][64] tile is 1024-byte aligned and written with the 128-byte swizzle.
  struct alignas(1024) Stage {
    Element q[2][kChunk][64];  // [K half][token][64]
    Element k[2][kChunk][64];
    Element v[kChains][kChunk][64];  // [chain][token][its 64 v-columns]
    Element t[kChunk][64];     // T[i][j] (delta rule)
    Element p[kChunk][64];     // the packed T_u as loaded (delta rule), then P[i][j]
    float g[kChunk];           // raw gates, zero past the chunk
    float beta[kChunk];        // raw beta, zero past the chunk
    float g2[kChunk];          // G = inclusive cumsum(g), times log2(e)
    float eg[kChunk];          // e^G
    float w[kChunk];           // e^(G_last - G)
  };
  struct alignas(1024) SharedStorage {
    Stage stage[kStages];
    // [chain][token][v-column]: o's TMA box, swizzled. One per chain (two would pass 227 KB):
    // a chunk's TMA store has read it before the next chunk writes it.
    Element o_stage[kChains][kChunk][64];
    // kFused: the delta rule's A, then its E blocks, one chunk at a time (the prep's inverse).
    __half inv_a[kChunk][kInvLd];
    uint64_t full[kStages], prep_full[kStages], empty[kStages];
  };
  // Arrivals that complete a phase of each mbarrier (the protocol above).
  static constexpr uint32_t kFullArrivals = 1 + 32;  // expect_tx, then the producer's 32 lanes
  static constexpr uint32_t kPrepFullArrivals = 128;
  static constexpr uint32_t kEmptyArrivals = 128 * (1 + kChains);

  static constexpr uint32_t kLoadBytes = sizeof(Stage::q) + sizeof(Stage::k) + sizeof(Stage::v);
  static constexpr uint32_t kTuBytes = PackedTu::kElems * sizeof(Element);
  static constexpr uint32_t kLoadBytesDelta = kLoadBytes + kTuBytes;
  static_assert(kTuBytes <= sizeof(Stage::p), "the packed T_u lands in the P tile");
  // kFused: the prep's T_u (fp16, row stride kInvLd) spans the stage's t and p tiles.
  static_assert(offsetof(Stage, p) == offsetof(Stage, t) + sizeof(Stage::t) &&
                    kChunk * kInvLd * sizeof(__half) <= sizeof(Stage::t) + sizeof(Stage::p),
                "the fused T_u spans the t and p tiles");
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

// Named barrier ids (bar.sync; 0 is __syncthreads), each over one warpgroup's 128 threads.
enum class ChunkBarrier : uint32_t {
  kPrep = 1,   // the prep warpgroup
  kChain = 2,  // chain c's warpgroup: kChain + c
};

__device__ __forceinline__ void named_barrier_sync(ChunkBarrier id) {
  ptx::named_barrier_sync(static_cast<uint32_t>(id), 128);
}

// By one thread, before the CTA's first __syncthreads.
template <typename Element>
__device__ __forceinline__ void init_chunk_barriers() {
  using Tr = ChunkSm90Traits<Element>;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  for (int i = 0; i < Tr::kStages; ++i) {
    ptx::mbarrier_init(ptx::smem_addr(&s.full[i]), Tr::kFullArrivals);
    ptx::mbarrier_init(ptx::smem_addr(&s.prep_full[i]), Tr::kPrepFullArrivals);
    ptx::mbarrier_init(ptx::smem_addr(&s.empty[i]), Tr::kEmptyArrivals);
  }
  ptx::fence_barrier_init();
}

// How the kernel is cut into role functions without changing its SASS (that of the one-body
// kernel it was cut from; scripts/kernel_sass.py compares them):
// - A function that addresses the shared storage forms its pointer itself, as
//   `*reinterpret_cast<SharedStorage*>(smem_raw + smem_align_offset())`: a storage pointer passed
//   in or returned reaches ptxas as other address arithmetic. Pointers are passed only where the
//   one-body kernel shared one among steps: the storage and the stage its lambdas captured
//   (issue_y, load_eg, decay_state), the prep's fused T_u tile.
// - Scalars and arrays go by reference (ChunkContext, the per-chunk PrepChunk and ChainChunk, the
//   chunk index), as the lambdas captured them: passed by value, the compiler orders their
//   operations otherwise. Values are computed where the one-body kernel computed them.
// - What a loop carries from chunk to chunk is declared in the shell (kernel.cuh).

// What the role functions read: the CTA's work item (a sequence or a segment of one, v-head
// hv) and this thread's place in it.
struct ChunkContext {
  const ChunkSm90Params& p;
  bool state_map;           // the delta rule's state-map pass: S = I, v taken as zeros
  float* final_state;       // where S goes at the end (p.final_state or p.state_maps), or nullptr
  int hv, n;                // v-head, work item (sequence, or sequence * segments + segment)
  int len;                  // tokens walked, warm-up chunks included
  int tma_row0, tma_batch;  // the first walked token's TMA coordinates
  int64_t row_base;         // row of the first walked token in the (B * T) token rows
  int warm;                 // warm-up chunks before the sequence's (segment's) first token
  int num_chunks, head_qk;
  int tid, warp, lane;      // in the warpgroup
  // Accumulator fragment of an m64nN wgmma: this thread holds rows r and r + 8, and in each
  // 8-column group j the columns 8j + 2 (lane % 4) + {0, 1}:
  //   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c),  r = 16 warp + lane / 4.
  int frag_row, frag_col;
};

}  // namespace dsv4
